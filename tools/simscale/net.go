package simscale

import (
	"math"
	"math/rand/v2"
	"time"
)

// Link is one host's access link.
type Link struct {
	Up, Down float64       // bytes per second
	Half     time.Duration // this host's half of the one-way delay to any other
	Loss     float64       // packet loss probability on this link, 0..1
}

// host is a link and what crossed it.
type host struct {
	Link
	// bgUp and bgDown are bytes per second taken by traffic modelled as a
	// steady rate (pull answers), not as flows.
	bgUp, bgDown float64
	traffic
}

// traffic counts what one host sent and received.
type traffic struct {
	sentBytes, recvBytes float64
	sentMsgs, recvMsgs   float64
}

func (t *traffic) add(o traffic) {
	t.sentBytes += o.sentBytes
	t.recvBytes += o.recvBytes
	t.sentMsgs += o.sentMsgs
	t.recvMsgs += o.recvMsgs
}

// Transport constants of the flow model.
const (
	mss = 1460 // bytes per TCP segment
	// maxWindow is the largest receive window Linux grows a TCP connection
	// to by default (net.ipv4.tcp_rmem's maximum, 6 MiB): a flow moves at
	// most this much per round trip.
	maxWindow = 6 << 20
	// minRTO is Linux's smallest retransmission timeout: a lost packet of a
	// small message costs at least this, plus the round trip.
	minRTO = 200 * time.Millisecond
	// minShare keeps a link that background traffic fills from stalling its
	// flows entirely (TCP flows still get some of a congested link).
	minShare = 0.05
)

// flow is a bulk transfer in progress.
type flow struct {
	src, dst  int
	remaining float64 // bytes
	rate      float64 // bytes per second since the last step
	cap       float64 // the most this flow can move per second (window, loss)
	finishing bool    // it completes before the next step; its rate is kept until then
	done      func()
	frozen    bool // allocate's scratch
}

// network moves messages and flows between hosts in virtual time.
type network struct {
	s        *sched
	rng      *rand.Rand
	hosts    []host
	flows    []*flow
	step     time.Duration // how often flow rates are recomputed
	stepping bool          // a step event is scheduled
	lastStep time.Duration
	steps    uint64
}

// delay is the one-way delay between two hosts.
func (n *network) delay(a, b int) time.Duration { return n.hosts[a].Half + n.hosts[b].Half }

// loss is the probability that a packet between two hosts is lost.
func (n *network) loss(a, b int) float64 {
	return 1 - (1-n.hosts[a].Loss)*(1-n.hosts[b].Loss)
}

// message delivers a small message of size bytes from a to b and then runs
// fn: after the one-way delay and, with the probability that one of its
// packets is lost, a retransmission timeout more.
func (n *network) message(a, b int, size int, fn func()) {
	n.count(a, b, float64(size), 1)
	d := n.delay(a, b)
	if p := n.loss(a, b); p > 0 {
		packets := float64(size/mss + 1)
		if n.rng.Float64() < 1-math.Pow(1-p, packets) {
			d += max(minRTO, 2*n.delay(a, b)) + 2*n.delay(a, b)
		}
	}
	n.s.after(d, fn)
}

// count records traffic between two hosts that no event models.
func (n *network) count(a, b int, bytes, msgs float64) {
	n.hosts[a].sentBytes += bytes
	n.hosts[a].sentMsgs += msgs
	n.hosts[b].recvBytes += bytes
	n.hosts[b].recvMsgs += msgs
}

// flowCap is the most one TCP flow between a and b moves per second: its
// window over the round trip and, on a lossy path, the loss-limited rate
// of TCP's congestion control, MSS·1.22/(RTT·√p) (Mathis et al. 1997; CUBIC
// falls back to it at such loss rates).
func (n *network) flowCap(a, b int) float64 {
	rtt := 2 * n.delay(a, b).Seconds()
	if rtt <= 0 {
		return math.Inf(1)
	}
	c := maxWindow / rtt
	if p := n.loss(a, b); p > 0 {
		c = min(c, mss*1.22/(rtt*math.Sqrt(p)))
	}
	return c
}

// transfer moves size bytes from a to b as a flow: sent runs (if not nil)
// when the last byte has left a, arrived when it has reached b.
func (n *network) transfer(a, b int, size int, sent, arrived func()) {
	n.count(a, b, float64(size), 1)
	f := &flow{src: a, dst: b, remaining: float64(size), cap: n.flowCap(a, b)}
	lat := n.delay(a, b)
	f.done = func() {
		if sent != nil {
			sent()
		}
		n.s.after(lat, arrived)
	}
	n.flows = append(n.flows, f)
	if !n.stepping {
		// An idle network starts at once; a busy one gives a new flow its
		// share at the next step.
		n.stepping = true
		n.lastStep = n.s.now
		n.s.after(0, n.advance)
	}
}

// advance is one step of the fluid model: it charges every flow for the
// time since the last step, recomputes the max-min fair rates, and
// schedules the completion of the flows that end before the next step.
func (n *network) advance() {
	n.steps++
	elapsed := (n.s.now - n.lastStep).Seconds()
	n.lastStep = n.s.now
	live := n.flows[:0]
	for _, f := range n.flows {
		if f.finishing {
			continue // completed at its own event, before now
		}
		f.remaining -= f.rate * elapsed
		live = append(live, f)
	}
	clear(n.flows[len(live):])
	n.flows = live
	if len(n.flows) == 0 {
		n.stepping = false
		return
	}
	n.allocate()
	horizon := n.step.Seconds()
	for _, f := range n.flows {
		if f.remaining <= f.rate*horizon {
			f.finishing = true
			n.s.after(time.Duration(max(f.remaining, 0)/f.rate*float64(time.Second)), f.done)
		}
	}
	n.s.after(n.step, n.advance)
}

// allocate sets every flow's rate to its max-min fair share of the uplinks
// and downlinks (progressive filling), each capped by flowCap.
func (n *network) allocate() {
	h := len(n.hosts)
	upCap, downCap := make([]float64, h), make([]float64, h)
	upN, downN := make([]int, h), make([]int, h)
	for i := range n.hosts {
		hs := &n.hosts[i]
		upCap[i] = max(hs.Up-hs.bgUp, minShare*hs.Up)
		downCap[i] = max(hs.Down-hs.bgDown, minShare*hs.Down)
	}
	for _, f := range n.flows {
		f.frozen = false
		upN[f.src]++
		downN[f.dst]++
	}
	left := len(n.flows)
	var freeze []*flow
	for left > 0 {
		level := math.Inf(1)
		for i := 0; i < h; i++ {
			if upN[i] > 0 {
				level = min(level, upCap[i]/float64(upN[i]))
			}
			if downN[i] > 0 {
				level = min(level, downCap[i]/float64(downN[i]))
			}
		}
		for _, f := range n.flows {
			if !f.frozen {
				level = min(level, f.cap)
			}
		}
		at := level * (1 + 1e-9)
		freeze = freeze[:0]
		for _, f := range n.flows {
			if !f.frozen && (f.cap <= at || upCap[f.src]/float64(upN[f.src]) <= at || downCap[f.dst]/float64(downN[f.dst]) <= at) {
				freeze = append(freeze, f)
			}
		}
		for _, f := range freeze {
			f.frozen = true
			f.rate = max(level, 1) // a byte a second at least: every flow ends
			upCap[f.src] -= level
			downCap[f.dst] -= level
			upN[f.src]--
			downN[f.dst]--
			left--
		}
	}
}
