package connlimit

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
)

// IPv6 addresses are grouped by their /64, IPv4 ones (mapped or not) are
// each their own group, and what is not an IP is its own text.
func TestGroup(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"127.0.0.1:80", "127.0.0.1/32"},
		{"127.0.0.2:80", "127.0.0.2/32"},
		{"10.1.2.3", "10.1.2.3/32"},
		{"[::ffff:127.0.0.5]:9", "127.0.0.5/32"}, // IPv4-mapped: the IPv4 address
		{"::ffff:10.0.0.1", "10.0.0.1/32"},
		{"[::1]:80", "::/64"},
		{"[2001:db8::1]:443", "2001:db8::/64"},
		{"[2001:db8::ffff:ffff:ffff:ffff]:443", "2001:db8::/64"}, // the same /64
		{"[2001:db8:0:0:1234:5678:9abc:def0]:1", "2001:db8::/64"},
		{"[2001:db8:0:1::1]:443", "2001:db8:0:1::/64"}, // the next /64
		{"[fe80::1%eth0]:22", "fe80::/64"},             // the zone does not count
		{"2001:db8:aaaa:bbbb:cccc::1", "2001:db8:aaaa:bbbb::/64"},
		{"in-process", "in-process"},
		{"pipe", "pipe"},
	} {
		if got := GroupOf(tt.in); got != tt.want {
			t.Errorf("GroupOf(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	for _, tt := range []struct {
		a    net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("2001:db8::7"), Port: 1}, "2001:db8::/64"},
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 3), Port: 1}, "127.0.0.3/32"}, // a 16-byte IPv4 address
		{&net.UDPAddr{IP: net.ParseIP("2001:db8:1:2:3::9")}, "2001:db8:1:2::/64"},
		{&net.UnixAddr{Name: "/tmp/s", Net: "unix"}, "/tmp/s"},
	} {
		if got := GroupOfAddr(tt.a); got != tt.want {
			t.Errorf("GroupOfAddr(%v) = %q, want %q", tt.a, got, tt.want)
		}
	}
	if a, b := Group(netip.MustParseAddr("2001:db8::1")), Group(netip.MustParseAddr("2001:db8::2")); a != b {
		t.Errorf("one /64, two groups: %v %v", a, b)
	}
}

type holder struct {
	slot *Slot
	shed bool
}

func acquire(t *testing.T, p *Pool, key string, sheddable bool) *holder {
	t.Helper()
	h := &holder{}
	h.slot = p.Acquire(key, sheddable, func() { h.shed = true })
	if h.slot == nil {
		return nil
	}
	return h
}

// A group at its cap is refused (or, recycling, gives up its oldest
// sheddable slot); a full pool sheds the heaviest group's oldest sheddable
// slot for a lighter newcomer, and refuses a newcomer that is (nearly) as
// heavy as anyone.
func TestPool(t *testing.T) {
	p := NewPool(6, 3, false)
	a := []*holder{acquire(t, p, "a", true), acquire(t, p, "a", true), acquire(t, p, "a", true)}
	if acquire(t, p, "a", true) != nil {
		t.Fatal("a fourth slot for a group capped at 3")
	}
	b := []*holder{acquire(t, p, "b", true), acquire(t, p, "b", false)}
	c := acquire(t, p, "c", true)
	if c == nil || b[0] == nil || b[1] == nil {
		t.Fatal("refused below the caps")
	}
	// Full (a 3, b 2, c 1). d (0) sheds a's oldest: a is the heaviest.
	d := acquire(t, p, "d", true)
	if d == nil || !a[0].shed || a[1].shed {
		t.Fatalf("a newcomer to a full pool: admitted %v, a's slots shed %v %v", d != nil, a[0].shed, a[1].shed)
	}
	a[0].slot.Release() // after the shed: counted once
	if n, na := p.Len("a"); n != 6 || na != 2 {
		t.Fatalf("after a shed: %d slots, a holds %d; want 6 and 2", n, na)
	}
	// a 2, b 2, c 1, d 1: a newcomer from c (1) sheds nothing (no group
	// holds 3). One from e (0) does: a and b both hold 2, and the older
	// sheddable slot of the two is a's.
	if acquire(t, p, "c", true) != nil {
		t.Fatal("c (1) shed a group of 2: floods would shed each other in turn")
	}
	e := acquire(t, p, "e", true)
	if e == nil || !a[1].shed {
		t.Fatalf("e: admitted %v, a's oldest shed %v", e != nil, a[1].shed)
	}
	// a 1, b 2 (one slot not sheddable), c 1, d 1, e 1: f sheds b's
	// sheddable one; g finds only b's busy slot among the groups of 2+, and
	// is refused.
	f := acquire(t, p, "f", true)
	if f == nil || !b[0].shed {
		t.Fatalf("f: admitted %v, b's sheddable slot shed %v", f != nil, b[0].shed)
	}
	if acquire(t, p, "g", true) != nil {
		t.Fatal("a newcomer shed a slot that was not sheddable")
	}
	// A slot made sheddable can go; made busy again, it cannot.
	b[1].slot.SetSheddable(true)
	b[1].slot.SetSheddable(false)
	if acquire(t, p, "g", true) != nil {
		t.Fatal("shed a slot that is busy again")
	}
	if _, refused := p.Counts(); refused != 4 {
		t.Fatalf("refused %d, want 4", refused)
	}
	for _, h := range []*holder{a[2], b[1], c, d, e, f} {
		h.slot.Release()
		h.slot.Release()
	}
	if n, _ := p.Len("a"); n != 0 || len(p.groups) != 0 {
		t.Fatalf("after every release: %d slots, %d groups", n, len(p.groups))
	}
	if shed, _ := p.Counts(); shed != 3 {
		t.Fatalf("shed %d, want 3", shed)
	}
}

// Recycling: a group at its cap gives its oldest sheddable slot to a
// newcomer of its own, and a full pool with nobody heavier does the same.
func TestPoolRecycles(t *testing.T) {
	p := NewPool(4, 2, true)
	a1, a2 := acquire(t, p, "a", true), acquire(t, p, "a", true)
	a3 := acquire(t, p, "a", true)
	if a3 == nil || !a1.shed || a2.shed {
		t.Fatalf("a third of a group of 2: admitted %v, shed %v %v", a3 != nil, a1.shed, a2.shed)
	}
	a2.slot.SetSheddable(false)
	a3.slot.SetSheddable(false)
	if acquire(t, p, "a", true) != nil {
		t.Fatal("recycled a busy slot")
	}
	b1, b2 := acquire(t, p, "b", true), acquire(t, p, "b", true)
	b3 := acquire(t, p, "b", true) // full and b is as heavy as a: its own
	if b3 == nil || !b1.shed || b2.shed {
		t.Fatalf("b at its cap: admitted %v, shed %v %v", b3 != nil, b1.shed, b2.shed)
	}
}

type fakeConn struct {
	net.Conn
	remote net.Addr
	closed bool
}

func (c *fakeConn) RemoteAddr() net.Addr { return c.remote }
func (c *fakeConn) Close() error         { c.closed = true; return nil }

type fakeListener struct {
	net.Listener
	next chan *fakeConn
}

func (l *fakeListener) Accept() (net.Conn, error) {
	c, ok := <-l.next
	if !ok {
		return nil, errors.New("closed")
	}
	return c, nil
}

// The listener counts an IPv6 /64 as one address: 16 addresses of one /64
// hold the group's cap between them, and a new connection from the /64
// closes the oldest idle one; another /64 (or an IPv4 address) is admitted
// alongside, and past the total the heaviest group gives way.
func TestListenerGroupsIPv6By64(t *testing.T) {
	fl := &fakeListener{next: make(chan *fakeConn, 64)}
	l := NewListener(fl, 24, 16)
	accept := func(remote string) (*Conn, *fakeConn) {
		t.Helper()
		fc := &fakeConn{remote: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(remote))}
		fl.next <- fc
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return c.(*Conn), fc
	}
	var flood []*Conn
	var raw []*fakeConn
	for i := range 16 {
		c, fc := accept(fmt.Sprintf("[2001:db8::%x]:1000", i+1))
		c.SetSheddable(false) // busy: a request in progress
		flood, raw = append(flood, c), append(raw, fc)
	}
	if _, n := l.Pool().Len("2001:db8::/64"); n != 16 {
		t.Fatalf("the /64 holds %d, want 16", n)
	}
	// A 17th address of the /64, with every connection busy: refused, and
	// Accept moves on to the next connection, from another /64.
	refused := &fakeConn{remote: net.TCPAddrFromAddrPort(netip.MustParseAddrPort("[2001:db8::99]:1"))}
	fl.next <- refused
	accept("[2001:db8:0:1::1]:1")
	if !refused.closed {
		t.Fatal("a 17th connection from one /64 was not refused")
	}
	if _, n := l.Pool().Len("2001:db8:0:1::/64"); n != 1 {
		t.Fatal("another /64 was not admitted")
	}
	// Two of the /64's connections go idle: the next from the /64 takes the
	// place of the one idle longest.
	flood[5].SetSheddable(true)
	flood[3].SetSheddable(true)
	accept("[2001:db8::abcd]:2")
	if !raw[5].closed || raw[3].closed {
		t.Fatalf("a new connection from a full /64: closed the idle ones %v (oldest) %v, want true false", raw[5].closed, raw[3].closed)
	}
	// Fill the total (24) from IPv4 addresses, each its own group; then a
	// newcomer sheds the heaviest group's idle connection: the /64's.
	for i := range 7 {
		accept(fmt.Sprintf("10.0.0.%d:1", i+1))
	}
	if n, _ := l.Pool().Len(""); n != 24 {
		t.Fatalf("%d connections, want 24", n)
	}
	accept("[::ffff:10.0.0.1]:2") // 10.0.0.1 (1): nobody holds 3+ but the /64
	if !raw[3].closed {
		t.Fatal("a full listener did not shed the heaviest group's idle connection")
	}
	if n, g := l.Pool().Len("10.0.0.1/32"); n != 24 || g != 2 {
		t.Fatalf("%d connections, 10.0.0.1 holds %d; want 24, 2", n, g)
	}
	// Closing a connection gives its slot back, once.
	flood[0].Close()
	flood[0].Close()
	if n, _ := l.Pool().Len(""); n != 23 {
		t.Fatalf("%d connections after a close, want 23", n)
	}
}
