package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/tidemark/tidemark/consume"
	"github.com/tidemark/tidemark/sink/kafka"
)

func runConsume(ctx context.Context, args []string, e *env) error {
	fs := newFlags("consume", "consume --from kafka://HOST:PORT[,...]/PREFIX --to DSN --group NAME [flags]", e)
	from := fs.String("from", "", "the Kafka output to read, its `URL` (kafka://HOST:PORT[,...]/PREFIX, as given to sync --to)")
	to := envFlag(fs, "to", "TIDEMARK_TARGET", isDSN, "the PostgreSQL to apply the output to, a `DSN`; its tables must exist, as on the source")
	group := fs.String("group", "", "the consumer group: members of one group share the tables; its offsets are kept on the target")
	targetSchema := fs.String("target-schema", "", "apply every table into this schema; default the source table's schema")
	stop := fs.Bool("stop-when-caught-up", false, "end once the group applied every record committed to the output when this member joined")
	session := fs.Duration("session-timeout", 10*time.Second, "how long the group waits for a member that stopped answering (killed, cut off) before its tables go to the others; the brokers bound it (group.min.session.timeout.ms, 6 s by default)")
	rebalance := fs.Duration("rebalance-timeout", 30*time.Second, "how long a rebalance waits for the members to join again; a member still applying a batch past it is left out (its transaction is then refused and read again)")
	if err := parse(fs, args); err != nil {
		return err
	}
	problems := outOfRange(durationRange("session-timeout", *session, time.Second, time.Hour),
		durationRange("rebalance-timeout", *rebalance, 3*time.Second, time.Hour))
	if *from == "" {
		problems = append(problems, "--from is needed (kafka://HOST:PORT[,...]/PREFIX)")
	}
	if *to == "" {
		problems = append(problems, "--to is needed (a PostgreSQL connection string), or $TIDEMARK_TARGET")
	}
	if *group == "" {
		problems = append(problems, "--group is needed (a consumer group name)")
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", errUsage, strings.Join(problems, "; "))
	}
	addr, err := kafka.ParseURL(*from)
	if err != nil {
		return fmt.Errorf("%w: --from: %w", errUsage, err)
	}
	return consume.Run(ctx, consume.Options{Address: addr, Target: *to, Group: *group, TargetSchema: *targetSchema,
		StopWhenCaughtUp: *stop, SessionTimeout: *session, RebalanceTimeout: *rebalance, Log: e.log})
}
