package chaos

import (
	"context"
	"net"
	"sync"
	"time"
)

// proxy is a TCP proxy between the capture and PostgreSQL that drops, resets and stalls
// connections on demand.
type proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   map[*proxyConn]bool
	stalled chan struct{} // closed when not stalled; replaced while a stall lasts
	wg      sync.WaitGroup
}

type proxyConn struct {
	client, server net.Conn
}

func newProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, conns: map[*proxyConn]bool{}, stalled: closedChan()}
	p.wg.Go(func() {
		p.accept()
	})
	return p, nil
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

func (p *proxy) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		pc := &proxyConn{client: c, server: s}
		p.mu.Lock()
		p.conns[pc] = true
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			p.pipe(s, c)
			p.close(pc, false)
		}()
		go func() {
			defer p.wg.Done()
			p.pipe(c, s)
			p.close(pc, false)
		}()
	}
}

// pipe copies src to dst, waiting while the proxy is stalled.
func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			wait := p.stalled
			p.mu.Unlock()
			<-wait
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) close(pc *proxyConn, reset bool) {
	p.mu.Lock()
	delete(p.conns, pc)
	p.mu.Unlock()
	if reset {
		for _, c := range []net.Conn{pc.client, pc.server} {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // close with RST
			}
		}
	}
	pc.client.Close()
	pc.server.Close()
}

// drop closes every connection (a FIN to both sides); reset closes them with a RST.
func (p *proxy) drop(reset bool) int {
	p.mu.Lock()
	var all []*proxyConn
	for pc := range p.conns {
		all = append(all, pc)
	}
	p.mu.Unlock()
	for _, pc := range all {
		p.close(pc, reset)
	}
	return len(all)
}

// stall stops forwarding for d, in both directions, on every connection.
func (p *proxy) stall(ctx context.Context, d time.Duration) {
	p.mu.Lock()
	ch := make(chan struct{})
	p.stalled = ch
	p.mu.Unlock()
	sleep(ctx, d)
	close(ch)
}

func (p *proxy) Close() {
	p.ln.Close()
	p.drop(false)
	p.wg.Wait()
}
