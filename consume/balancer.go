package consume

import (
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// BalancerName is the consumer group protocol of tidemark consume: whole topics to members.
const BalancerName = "tidemark-table"

// tableBalancer assigns each topic whole to one member of the group: a table's truncate or
// refresh is in every partition of its topic, and is applied once, when every partition has
// reached it, which only a member holding them all can see. Members share the tables, not a
// table's partitions.
type tableBalancer struct{}

var _ kgo.GroupBalancer = tableBalancer{}

func (tableBalancer) ProtocolName() string { return BalancerName }
func (tableBalancer) IsCooperative() bool  { return false }

func (tableBalancer) JoinGroupMetadata(interests []string, _ map[string][]int32, generation int32) []byte {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version = 0
	meta.Topics = interests
	meta.Generation = generation
	return meta.AppendTo(nil)
}

func (tableBalancer) ParseSyncAssignment(assignment []byte) (map[string][]int32, error) {
	return kgo.ParseConsumerSyncAssignment(assignment)
}

func (b tableBalancer) MemberBalancer(members []kmsg.JoinGroupResponseMember) (kgo.GroupMemberBalancer, map[string]struct{}, error) {
	cb, err := kgo.NewConsumerBalancer(b, members)
	if err != nil {
		return nil, nil, err
	}
	return cb, cb.MemberTopics(), nil
}

// Balance deals the topics, in name order, to the members interested in them, in turn: each
// topic with all its partitions.
func (tableBalancer) Balance(b *kgo.ConsumerBalancer, topics map[string]int32) kgo.IntoSyncAssignment {
	plan := b.NewPlan()
	type member struct {
		m      *kmsg.JoinGroupResponseMember
		topics []string
		n      int
	}
	var ms []*member
	b.EachMember(func(m *kmsg.JoinGroupResponseMember, meta *kmsg.ConsumerMemberMetadata) {
		ms = append(ms, &member{m: m, topics: meta.Topics})
	})
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	slices.Sort(names)
	for _, t := range names {
		var best *member
		for _, m := range ms {
			if slices.Contains(m.topics, t) && (best == nil || m.n < best.n) {
				best = m
			}
		}
		if best == nil {
			continue
		}
		best.n++
		parts := make([]int32, topics[t])
		for i := range parts {
			parts[i] = int32(i)
		}
		plan.AddPartitions(best.m, t, parts)
	}
	return plan
}
