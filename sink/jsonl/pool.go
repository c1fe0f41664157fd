package jsonl

import (
	"context"
	"runtime"
	"sync"

	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
)

// MaxEncoders bounds Pool's encoders.
const MaxEncoders = 64

// poolRound is how many events a Pool encodes at once, split among its encoders: the lines of
// one round are held until they are written, so a round bounds the memory (a few MB), whatever
// the size of the batch.
const poolRound = 4096

// minParallel is the smallest batch a Pool splits: below it, the goroutines cost more than
// they save.
const minParallel = 256

// Pool encodes a batch of events into lines with several encoders at once, and hands the lines
// on in the events' order: an ordered pool. The merge loop hands the sink a chunk's rows in one
// batch, and encoding them is most of the sink's work; split among goroutines it runs on the
// cores the merge loop's one goroutine leaves idle. Each encoder keeps its own caches (column
// names, the last LSN's and time's text); the lines are the same as one Encoder's, byte for
// byte (TestPoolLinesAsOneEncoder). The batch's column types are looked up first, on the
// caller's goroutine, so the encoders find them in the registry and none of them queries the
// source. The goroutines of a round are started and waited for by Encode: none outlives it.
type Pool struct {
	types  *pgjson.Registry
	one    *Encoder   // the caller's: small batches, and the lookups of a batch's types
	single []byte     // its line buffer
	encs   []*Encoder // one per part of a round, when more than one
	bufs   [][]byte
	errs   []error
}

// NewPool returns a Pool of n encoders whose values take their forms from types; n of 0 is one
// per core past the first (the merge loop's), at most 8, and 1 encodes on the caller's goroutine.
func NewPool(types *pgjson.Registry, n int) *Pool {
	if n <= 0 {
		n = min(8, runtime.GOMAXPROCS(0)-1)
	}
	n = max(1, min(n, MaxEncoders))
	p := &Pool{types: types, one: NewEncoder(types)}
	if n > 1 {
		for range n {
			p.encs = append(p.encs, NewEncoder(types))
		}
		p.bufs, p.errs = make([][]byte, n), make([]error, n)
	}
	return p
}

// Encoders is how many encoders the pool runs at once.
func (p *Pool) Encoders() int { return max(1, len(p.encs)) }

// Encode encodes evs into lines and calls write with them, in order, a round of lines at a time
// (write must not keep the slice). An encoding error is returned before the lines of its round
// are written.
func (p *Pool) Encode(ctx context.Context, evs []merge.Event, write func([]byte) error) error {
	if len(p.encs) == 0 || len(evs) < minParallel {
		buf := p.single
		for i := range evs {
			var err error
			if buf, err = p.one.Append(ctx, buf[:0], &evs[i]); err != nil {
				return err
			}
			if err := write(buf); err != nil {
				return err
			}
		}
		p.single = buf
		return nil
	}
	for i := range evs {
		if _, err := p.one.columns(ctx, evs[i].Columns); err != nil {
			return err
		}
	}
	for start := 0; start < len(evs); start += poolRound {
		if err := p.round(ctx, evs[start:min(len(evs), start+poolRound)], write); err != nil {
			return err
		}
	}
	return nil
}

// round encodes evs in len(p.encs) contiguous parts at once, then writes the parts in order.
func (p *Pool) round(ctx context.Context, evs []merge.Event, write func([]byte) error) error {
	n := len(p.encs)
	size := (len(evs) + n - 1) / n
	var wg sync.WaitGroup
	for k := range n {
		lo, hi := min(len(evs), k*size), min(len(evs), (k+1)*size)
		p.bufs[k], p.errs[k] = p.bufs[k][:0], nil
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := p.bufs[k]
			for i := lo; i < hi; i++ {
				var err error
				if b, err = p.encs[k].Append(ctx, b, &evs[i]); err != nil {
					p.errs[k] = err
					break
				}
			}
			p.bufs[k] = b
		}()
	}
	wg.Wait()
	for k := range n {
		if p.errs[k] != nil {
			return p.errs[k]
		}
	}
	for k := range n {
		if len(p.bufs[k]) > 0 {
			if err := write(p.bufs[k]); err != nil {
				return err
			}
		}
		if cap(p.bufs[k]) > 64<<20 {
			p.bufs[k] = nil // a round of huge rows: not kept for the next
		}
	}
	return nil
}
