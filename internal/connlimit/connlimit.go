// Package connlimit bounds what one network address can hold of a
// listener's connections, or of any other pool of slots (the servers'
// event streams): a cap per address group, and a total cap that, once
// full, sheds a slot of the heaviest group for a newcomer from a lighter
// one, so that one host (or one IPv6 /64) cannot keep everyone else out.
//
// Before it, the HTTP listeners had only a total cap (past it, new
// connections waited for a slot): 4,096 idle keep-alive connections from
// one host that sent a request every 20 s left a fresh client of the
// server's API waiting over 72 s, and streams were capped per exact IP, so
// the 2^64 addresses of one IPv6 /64 were that many "addresses".
package connlimit

import (
	"container/list"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Group is the address group of ip: an IPv4 address (or an IPv4-mapped
// IPv6 one) on its own, an IPv6 address by its /64, the prefix a single
// host or home is given (it can use any of its 2^64 addresses).
func Group(ip netip.Addr) netip.Prefix {
	ip = ip.Unmap().WithZone("")
	if ip.Is4() {
		return netip.PrefixFrom(ip, 32)
	}
	p, _ := ip.Prefix(64)
	return p
}

// GroupOf is the group key of a remote address as net/http gives it
// (RemoteAddr: "host:port") or of a bare host. Anything that is not an IP
// address is a group of its own, keyed by its text.
func GroupOf(remote string) string {
	host := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		host = h
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return remote
	}
	return Group(ip).String()
}

// GroupOfAddr is GroupOf for a connection's address.
func GroupOfAddr(a net.Addr) string {
	switch a := a.(type) {
	case *net.TCPAddr:
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return Group(ip).String()
		}
	case *net.UDPAddr:
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return Group(ip).String()
		}
	case nil:
		return ""
	}
	return GroupOf(a.String())
}

// Pool hands out slots, at most Total in all and PerGroup to one address
// group. When a group is at PerGroup, a newcomer from it takes the place
// of the group's oldest sheddable slot if RecycleOwn is set (an idle
// keep-alive connection gives way to a new one from the same host), and is
// refused otherwise. When the pool is at Total, a newcomer whose group
// holds at least two fewer slots than the heaviest group takes the place of
// that group's oldest sheddable slot (the "at least two" keeps two floods
// from shedding each other in turn); failing that, with RecycleOwn, of its
// own group's oldest; failing that, it is refused.
//
// A slot is sheddable while its holder can lose it at no cost to anyone
// but its own group (an idle connection, one that has not sent a whole
// request yet, an event stream whose client falls back to polling).
type Pool struct {
	total, perGroup int
	recycleOwn      bool

	mu     sync.Mutex
	n      int
	seq    uint64 // orders slots by when they became sheddable
	groups map[string]*group

	shed, refused atomic.Uint64
}

type group struct {
	key  string
	n    int
	idle list.List // the group's sheddable slots (*Slot), oldest first
}

// NewPool is a pool of total slots, perGroup to a group (both at least 1;
// perGroup is clipped to total).
func NewPool(total, perGroup int, recycleOwn bool) *Pool {
	total, perGroup = max(total, 1), max(perGroup, 1)
	return &Pool{total: total, perGroup: min(perGroup, total), recycleOwn: recycleOwn, groups: map[string]*group{}}
}

// Slot is one place in a pool.
type Slot struct {
	p        *Pool
	g        *group
	onShed   func()
	elem     *list.Element // in g.idle while sheddable
	seq      uint64
	released bool
}

// Acquire takes a slot for group key (GroupOf), sheddable or not, or
// returns nil when the pool refuses it. onShed, if not nil, is called
// (once, with no lock held) when the pool sheds the slot for a newcomer:
// by then the slot no longer counts, and its holder should let go of what
// it held (close the connection, end the stream).
func (p *Pool) Acquire(key string, sheddable bool, onShed func()) *Slot {
	p.mu.Lock()
	g := p.groups[key]
	if g == nil {
		g = &group{key: key}
		p.groups[key] = g
	}
	var victim *Slot
	switch {
	case g.n >= p.perGroup:
		if p.recycleOwn {
			victim = g.oldest()
		}
	case p.n >= p.total:
		victim = p.heaviest(g.n)
		if victim == nil && p.recycleOwn {
			victim = g.oldest()
		}
	default:
		s := p.add(g, sheddable, onShed)
		p.mu.Unlock()
		return s
	}
	if victim == nil {
		if g.n == 0 {
			delete(p.groups, key)
		}
		p.mu.Unlock()
		p.refused.Add(1)
		return nil
	}
	p.release(victim)
	s := p.add(g, sheddable, onShed)
	p.mu.Unlock()
	p.shed.Add(1)
	if victim.onShed != nil {
		victim.onShed()
	}
	return s
}

// heaviest is the oldest sheddable slot of the heaviest group that holds
// at least two more slots than a group of than (ties: the group whose oldest
// sheddable slot is oldest). The scan is linear in the groups, and runs
// only when the pool is full.
func (p *Pool) heaviest(than int) *Slot {
	var best *Slot
	bestN := 0
	for _, h := range p.groups {
		if h.n < than+2 || h.n < bestN {
			continue
		}
		o := h.oldest()
		if o == nil {
			continue
		}
		if h.n > bestN || o.seq < best.seq {
			best, bestN = o, h.n
		}
	}
	return best
}

func (g *group) oldest() *Slot {
	if e := g.idle.Front(); e != nil {
		return e.Value.(*Slot)
	}
	return nil
}

func (p *Pool) add(g *group, sheddable bool, onShed func()) *Slot {
	s := &Slot{p: p, g: g, onShed: onShed}
	g.n++
	p.n++
	if sheddable {
		p.mark(s)
	}
	return s
}

func (p *Pool) mark(s *Slot) {
	p.seq++
	s.seq = p.seq
	s.elem = s.g.idle.PushBack(s)
}

// release drops s from the counts; p.mu is held.
func (p *Pool) release(s *Slot) {
	if s.released {
		return
	}
	s.released = true
	if s.elem != nil {
		s.g.idle.Remove(s.elem)
		s.elem = nil
	}
	s.g.n--
	p.n--
	if s.g.n == 0 {
		delete(p.groups, s.g.key)
	}
}

// Release gives the slot back. It is safe to call more than once, and
// after the pool shed the slot.
func (s *Slot) Release() {
	s.p.mu.Lock()
	s.p.release(s)
	s.p.mu.Unlock()
}

// SetSheddable says whether the pool may shed the slot now. A slot that
// becomes sheddable again goes to the back of its group's line.
func (s *Slot) SetSheddable(on bool) {
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if s.released || on == (s.elem != nil) {
		return
	}
	if on {
		p.mark(s)
	} else {
		s.g.idle.Remove(s.elem)
		s.elem = nil
	}
}

// Len is how many slots are held, in all and by the group key.
func (p *Pool) Len(key string) (total, inGroup int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g := p.groups[key]; g != nil {
		inGroup = g.n
	}
	return p.n, inGroup
}

// Counts are how many slots the pool has shed and how many newcomers it
// has refused since it was made.
func (p *Pool) Counts() (shed, refused uint64) { return p.shed.Load(), p.refused.Load() }

// Listener caps the connections a net.Listener accepts with a Pool:
// Total in all and PerGroup from one address group, recycling a group's
// oldest sheddable connection for a new one from it. A connection it
// refuses is closed at once and Accept goes on to the next. Connections
// start sheddable (nothing read yet); an HTTP server tells it when they
// are busy (SetSheddable, see internal/httpserve).
type Listener struct {
	net.Listener
	pool *Pool
}

// NewListener wraps ln.
func NewListener(ln net.Listener, total, perGroup int) *Listener {
	return &Listener{Listener: ln, pool: NewPool(total, perGroup, true)}
}

// Pool is the listener's pool (its counts).
func (l *Listener) Pool() *Pool { return l.pool }

// Accept returns the next connection the caps admit.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		s := l.pool.Acquire(GroupOfAddr(c.RemoteAddr()), true, func() { _ = c.Close() })
		if s == nil {
			_ = c.Close()
			continue
		}
		return &Conn{Conn: c, slot: s}, nil
	}
}

// Conn is a connection a Listener admitted: closing it gives its slot back.
type Conn struct {
	net.Conn
	slot *Slot
	once sync.Once
}

// SetSheddable says whether the listener may close c for a newcomer (an
// idle keep-alive connection, one still waiting for a request) or not (a
// request in progress).
func (c *Conn) SetSheddable(on bool) { c.slot.SetSheddable(on) }

// Close closes the connection and gives its slot back.
func (c *Conn) Close() error {
	c.once.Do(c.slot.Release)
	return c.Conn.Close()
}
