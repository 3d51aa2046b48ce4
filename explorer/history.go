package explorer

import (
	"cmp"
	"slices"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

// Health of a client as the page shows it.
const (
	Healthy = "healthy" // a member of the current epoch in good standing
	Dropped = "dropped" // failed a health check (or was ejected); it leaves or has left the epoch
	Left    = "left"    // was a member and is no longer one, not dropped (epoch ended, withdrawn, gone)
	Pending = "pending" // joined, waits for the next epoch
)

// Point is one step of the run: what its witnesses reported. Rates are run
// wide: the witnesses' own rates scaled to the round's trainers.
type Point struct {
	Step         uint32   `json:"step"`
	Epoch        uint32   `json:"epoch"`
	Loss         *float64 `json:"loss,omitempty"`           // mean training loss of the witnesses' batches
	HeldOut      *float64 `json:"held_out,omitempty"`       // held-out loss, where measured (RecordHeldOut)
	TokensPerSec *float64 `json:"tokens_per_sec,omitempty"` // the trainers' tokens per second, summed
	BytesSent    *float64 `json:"bytes_sent,omitempty"`     // result bytes all trainers sent for the step
	Witnesses    int      `json:"witnesses"`
	Quorum       int      `json:"quorum"`
	Trainers     int      `json:"trainers"`
	rev          uint64
}

// Client is one client the run has had, with its latest health.
type Client struct {
	Signer string `json:"signer"`
	P2P    string `json:"p2p"`
	Health string `json:"health"`
	Index  int    `json:"index"` // position in the epoch's client list; -1 when not a member
	Since  uint32 `json:"since_epoch"`
}

// Witness is one witness report of a round.
type Witness struct {
	Index  int     `json:"index"` // the witness's position in the epoch's client list
	Signer string  `json:"signer"`
	Loss   float64 `json:"loss"`
}

// Round is one round in the coordinator's ring.
type Round struct {
	Height       uint32    `json:"height"`
	Step         uint32    `json:"step"`
	DataIndex    uint64    `json:"data_index"`
	Clients      int       `json:"clients"`
	WitnessSlots int       `json:"witness_slots"`
	Quorum       int       `json:"quorum"`
	Witnesses    []Witness `json:"witnesses"`
	Current      bool      `json:"current"`
}

// Checkpoint is a model source the run pointed at, and since when.
type Checkpoint struct {
	Epoch    uint32 `json:"epoch"`
	Step     uint32 `json:"step"`
	Kind     string `json:"kind"`
	URL      string `json:"url"`
	Revision string `json:"revision"`
	Recorded bool   `json:"recorded"` // recorded by a checkpointer in cooldown (else the run's model source changed)
	At       int64  `json:"at"`       // unix seconds, the run's clock
}

// View is a run's current state as the page shows it.
type View struct {
	ID            string `json:"id"`
	Name          string `json:"name"`
	Description   string `json:"description"`
	Parameters    uint64 `json:"parameters"`
	State         string `json:"state"`
	PendingPause  bool   `json:"pending_pause"`
	StateStart    uint64 `json:"state_start"`    // unix seconds, the run's clock
	StateDeadline uint64 `json:"state_deadline"` // when the state's timeout passes (0: none)
	StateTimeout  string `json:"state_timeout"`  // what happens then
	EpochStart    uint64 `json:"epoch_start"`
	EpochDeadline uint64 `json:"epoch_deadline"`
	Epoch         uint32 `json:"epoch"`
	Step          uint32 `json:"step"`
	TotalSteps    uint32 `json:"total_steps"`
	// TotalEpochs: the run ends after this many epochs whatever TotalSteps
	// says (WithEpochLimit: psyche localnet --epochs); 0: at TotalSteps.
	TotalEpochs uint32       `json:"total_epochs,omitempty"`
	LastStep    uint32       `json:"last_step"`
	MinClients  int          `json:"min_clients"`
	InitMin     int          `json:"init_min_clients"`
	Nonce       uint64       `json:"nonce"`
	Clients     []Client     `json:"clients"`
	Rounds      []Round      `json:"rounds"`
	Data        string       `json:"data"`       // where the training tokens come from (data.Describe)
	Checkpoint  Checkpoint   `json:"checkpoint"` // the current model source
	Checkpoints []Checkpoint `json:"checkpoints"`
	Error       string       `json:"error,omitempty"` // why the run's stream is down (it reconnects)
}

// history is what the explorer remembers of one run. It is a pure fold over
// snapshots: observe never reads a clock.
type history struct {
	view    View
	seen    bool
	points  []Point // by step, ascending; at most MaxPoints, the latest
	changed []Point // points made or changed since takeChanged, for a store
	rev     uint64  // bumped on every change; points carry the rev of their last change
	clients map[coordinator.Pubkey]*Client
	order   []coordinator.Pubkey // first seen first
}

func newHistory(id string) *history {
	return &history{view: View{ID: id, State: "unknown"}, clients: map[coordinator.Pubkey]*Client{}}
}

func key(k coordinator.Pubkey) string { return k.String() }

// observe folds one snapshot into the history; it reports whether anything
// the page shows changed.
func (h *history) observe(s *coordinator.Coordinator) bool {
	if h.seen && s.Nonce <= h.view.Nonce {
		return false
	}
	h.seen = true
	h.rev++
	h.observeView(s)
	h.observeClients(s)
	h.observeRounds(s)
	h.observeCheckpoint(s)
	return true
}

func (h *history) observeView(s *coordinator.Coordinator) {
	v := &h.view
	v.Name = coordinator.FixedString(s.Metadata.Name[:])
	v.Description = coordinator.FixedString(s.Metadata.Description[:])
	v.Parameters = s.Metadata.NumParameters
	v.Data = ""
	if loc := coordinator.FixedString(s.Model.DataLocation[:]); loc != "" {
		v.Data = data.Describe(loc)
	}
	if v.Parameters == 0 {
		// The run file's metadata may leave it out: the model the run
		// describes says it (a GPT of 120,576 parameters showed 0).
		if mc, err := modelspec.ModelConfig(&s.Model); err == nil {
			v.Parameters = uint64(mc.NumParams())
		}
	}
	v.State, v.PendingPause, v.StateStart = s.RunState.String(), s.PendingPause, s.RunStateStart
	v.Epoch, v.Step, v.TotalSteps, v.LastStep = s.Progress.Epoch, s.Progress.Step, s.Config.TotalSteps, s.Epoch.LastStep
	v.MinClients, v.InitMin, v.Nonce = int(s.Config.MinClients), int(s.Config.InitMinClients), s.Nonce
	v.Error = ""
	c := &s.Config
	timeout := func(d uint64, what string) {
		v.StateDeadline, v.StateTimeout = s.RunStateStart+d, what
	}
	v.StateDeadline, v.StateTimeout = 0, ""
	switch s.RunState {
	case coordinator.WaitingForMembers:
		timeout(c.WaitingForMembersExtraTime, "warmup, once enough clients are pending")
	case coordinator.Warmup:
		timeout(c.WarmupTime, "training (or early, once the warmup witnesses are in)")
	case coordinator.RoundTrain:
		timeout(c.MaxRoundTrainTime, "witnessing (or early, once every witness reported)")
	case coordinator.RoundWitness:
		timeout(c.RoundWitnessTime, "the next round, or cooldown (at the next tick once every witness reported)")
	case coordinator.Cooldown:
		timeout(c.CooldownTime, "the next epoch (or early, once a checkpoint is recorded)")
	}
	v.EpochStart, v.EpochDeadline = 0, 0
	if !s.RunState.Halted() && s.RunState != coordinator.WaitingForMembers {
		v.EpochStart, v.EpochDeadline = s.Epoch.StartTimestamp, s.Epoch.StartTimestamp+c.EpochTime
	}
}

func (h *history) client(id coordinator.ClientID) *Client {
	c, ok := h.clients[id.Signer]
	if !ok {
		c = &Client{Signer: key(id.Signer)}
		h.clients[id.Signer] = c
		h.order = append(h.order, id.Signer)
	}
	c.P2P = PeerID(id.P2P)
	return c
}

// PeerID is the libp2p peer id of an ed25519 p2p key, as trainers' logs
// and libp2p tools print it ("12D3KooW…"): base58 of the identity multihash
// (0x00, length 36) of the key's protobuf encoding (type Ed25519 = 1, data).
func PeerID(k coordinator.Pubkey) string {
	b := append([]byte{0x00, 0x24, 0x08, 0x01, 0x12, 0x20}, k[:]...)
	return coordinator.Base58(b)
}

func (h *history) observeClients(s *coordinator.Coordinator) {
	e := &s.Epoch
	present := map[coordinator.Pubkey]bool{}
	set := func(id coordinator.ClientID, health string, index int) {
		c := h.client(id)
		if c.Health != health {
			c.Since = s.Progress.Epoch
		}
		c.Health, c.Index = health, index
		present[id.Signer] = true
	}
	// Members first: they decide; then joiners; then those who exited.
	for i := uint16(0); i < e.ClientsLen; i++ {
		cl := e.Clients[i]
		switch cl.State {
		case coordinator.Healthy:
			set(cl.ID, Healthy, int(i))
		case coordinator.Withdrawn:
			set(cl.ID, Left, int(i))
		default:
			set(cl.ID, Dropped, int(i))
		}
	}
	for i := uint16(0); i < s.PendingLen; i++ {
		if !present[s.Pending[i].Signer] {
			set(s.Pending[i], Pending, -1)
		}
	}
	for i := uint16(0); i < e.ExitedLen; i++ {
		cl := e.Exited[i]
		if present[cl.ID.Signer] {
			continue
		}
		if cl.State == coordinator.Dropped || cl.State == coordinator.Ejected {
			set(cl.ID, Dropped, -1)
		} else {
			set(cl.ID, Left, -1)
		}
	}
	// Anyone the account no longer lists has left, unless it was dropped.
	for k, c := range h.clients {
		if !present[k] {
			c.Index = -1
			if c.Health != Dropped && c.Health != Left {
				c.Health, c.Since = Left, s.Progress.Epoch
			}
		}
	}
	order := map[string]int{Healthy: 0, Dropped: 1, Pending: 2, Left: 3}
	list := make([]Client, 0, len(h.order))
	for _, k := range h.order {
		list = append(list, *h.clients[k])
	}
	slices.SortStableFunc(list, func(a, b Client) int {
		if a.Index >= 0 && b.Index >= 0 {
			return cmp.Compare(a.Index, b.Index)
		}
		if (a.Index >= 0) != (b.Index >= 0) {
			if a.Index >= 0 {
				return -1
			}
			return 1
		}
		return cmp.Compare(order[a.Health], order[b.Health])
	})
	h.view.Clients = list
}

// observeRounds lists the ring's rounds and folds their witness reports
// into the step points. Warmup witnesses report no training, so the warmup
// round is skipped.
func (h *history) observeRounds(s *coordinator.Coordinator) {
	h.view.Rounds = h.view.Rounds[:0]
	if s.RunState == coordinator.Warmup || s.RunState == coordinator.Uninitialized {
		return
	}
	e := &s.Epoch
	cur := s.CurrentRound()
	for back := uint32(0); back <= min(cur.Height, coordinator.NumRounds-1); back++ {
		r := s.RoundAtHeight(cur.Height - back)
		if r == nil || r.ClientsLen == 0 {
			continue
		}
		slots := s.Config.WitnessCount(r.ClientsLen)
		rd := Round{Height: r.Height, Step: e.StartStep + r.Height, DataIndex: r.DataIndex, Clients: int(r.ClientsLen),
			WitnessSlots: int(slots), Quorum: int(coordinator.Quorum(slots)), Current: back == 0, Witnesses: []Witness{}}
		for j := uint8(0); j < r.WitnessesLen; j++ {
			w := &r.Witnesses[j]
			wi := Witness{Index: int(w.Proof.Index), Loss: float64(w.Metadata.Loss)}
			if int(w.Proof.Index) < int(e.ClientsLen) {
				wi.Signer = key(e.Clients[w.Proof.Index].ID.Signer)
			}
			rd.Witnesses = append(rd.Witnesses, wi)
		}
		h.view.Rounds = append(h.view.Rounds, rd)
		if r.WitnessesLen > 0 {
			h.foldRound(s, r, rd)
		}
	}
}

// foldRound makes (or updates) the point of a round's step from its
// witnesses' metadata.
func (h *history) foldRound(s *coordinator.Coordinator, r *coordinator.Round, rd Round) {
	assign := s.RoundAssignment(r)
	trainers := 0
	for _, a := range assign {
		if a.Count > 0 {
			trainers++
		}
	}
	var loss, tps, bytes float64
	var nLoss, nRate int
	for j := uint8(0); j < r.WitnessesLen; j++ {
		m := r.Witnesses[j].Metadata
		if m.Loss > 0 {
			loss += float64(m.Loss)
			nLoss++
		}
		idx := int(r.Witnesses[j].Proof.Index)
		if m.TokensPerSec > 0 && idx < len(assign) && assign[idx].Count > 0 {
			// The witness's seconds for its batch, and the bytes it sent in them.
			tokens := float64(assign[idx].Count) * float64(s.Model.MaxSeqLen)
			tps += float64(m.TokensPerSec)
			bytes += float64(m.BandwidthPerSec) * tokens / float64(m.TokensPerSec)
			nRate++
		}
	}
	p := Point{Step: rd.Step, Epoch: s.Progress.Epoch, Witnesses: len(rd.Witnesses), Quorum: rd.Quorum, Trainers: trainers}
	if st := s.RunState; (st == coordinator.WaitingForMembers || st.Halted()) && p.Epoch > 0 {
		p.Epoch-- // the epoch ended; its rounds are still in the ring
	}
	if nLoss > 0 {
		p.Loss = ptr(loss / float64(nLoss))
	}
	if nRate > 0 {
		p.TokensPerSec = ptr(tps / float64(nRate) * float64(trainers))
		p.BytesSent = ptr(bytes / float64(nRate) * float64(trainers))
	}
	i, found := slices.BinarySearchFunc(h.points, p.Step, func(q Point, step uint32) int { return cmp.Compare(q.Step, step) })
	if found {
		old := h.points[i]
		p.HeldOut, p.Epoch = old.HeldOut, old.Epoch
		if samePoint(old, p) {
			return
		}
		p.rev = h.rev
		h.points[i] = p
		h.changed = append(h.changed, p)
		return
	}
	p.rev = h.rev
	h.insert(i, p)
}

// MaxPoints is the most steps a run's history keeps (the latest): about
// 10 MB of memory and 15 MB of store at the most, whatever the run's length.
const MaxPoints = 100_000

// insert puts p at index i of the points, dropping the oldest beyond
// MaxPoints.
func (h *history) insert(i int, p Point) {
	h.points = slices.Insert(h.points, i, p)
	h.changed = append(h.changed, p)
	if over := len(h.points) - MaxPoints; over > 0 {
		h.points = slices.Delete(h.points, 0, over)
	}
}

// takeChanged returns the points made or changed since the last call.
func (h *history) takeChanged() []Point {
	c := h.changed
	h.changed = nil
	return c
}

// restore puts points a store kept (by step, ascending) into an empty
// history, as changed before any snapshot (so every watcher's first update
// has them).
func (h *history) restore(points []Point) {
	h.rev++
	for i := range points {
		points[i].rev = h.rev
	}
	if over := len(points) - MaxPoints; over > 0 {
		points = points[over:]
	}
	h.points = points
}

func samePoint(a, b Point) bool {
	eq := func(x, y *float64) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return a.Witnesses == b.Witnesses && a.Quorum == b.Quorum && a.Trainers == b.Trainers &&
		eq(a.Loss, b.Loss) && eq(a.TokensPerSec, b.TokensPerSec) && eq(a.BytesSent, b.BytesSent)
}

func ptr(f float64) *float64 { return &f }

// heldOut records a held-out loss measured at step.
func (h *history) heldOut(step, epoch uint32, loss float64) {
	h.rev++
	i, found := slices.BinarySearchFunc(h.points, step, func(q Point, s uint32) int { return cmp.Compare(q.Step, s) })
	if !found {
		h.points = slices.Insert(h.points, i, Point{Step: step, Epoch: epoch})
	}
	h.points[i].HeldOut = ptr(loss)
	h.points[i].rev = h.rev
	h.changed = append(h.changed, h.points[i])
	if over := len(h.points) - MaxPoints; over > 0 {
		h.points = slices.Delete(h.points, 0, over)
	}
}

func (h *history) observeCheckpoint(s *coordinator.Coordinator) {
	ck := s.Model.Checkpoint
	cur := Checkpoint{Epoch: s.Progress.Epoch, Step: s.Progress.Step, Kind: ck.Kind.String(),
		URL: coordinator.FixedString(ck.Source.URL[:]), Revision: coordinator.FixedString(ck.Source.Revision[:]),
		Recorded: s.Epoch.Checkpointed, At: int64(s.RunStateStart)}
	h.view.Checkpoint = cur
	if h.view.Checkpoints == nil {
		h.view.Checkpoints = []Checkpoint{}
	}
	if ck.Kind == coordinator.CheckpointNone {
		return
	}
	// A new entry when the model's location changes or a checkpoint is
	// recorded; a change of kind only (Hub to P2P as an epoch ends: the
	// clients now hold the model) updates the last one.
	n := len(h.view.Checkpoints)
	if n > 0 {
		last := &h.view.Checkpoints[n-1]
		if last.URL == cur.URL && last.Revision == cur.Revision && (last.Recorded || !cur.Recorded) {
			last.Kind = cur.Kind
			return
		}
	}
	h.view.Checkpoints = append(h.view.Checkpoints, cur)
}

// since returns the points changed after rev.
func (h *history) since(rev uint64) []Point {
	out := []Point{}
	for _, p := range h.points {
		if p.rev > rev {
			out = append(out, p)
		}
	}
	return out
}

// Summary is a run in the run list.
type Summary struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	State   string `json:"state"`
	Epoch   uint32 `json:"epoch"`
	Step    uint32 `json:"step"`
	Clients int    `json:"clients"`
	Error   string `json:"error,omitempty"`
}

func (h *history) summary() Summary {
	n := 0
	for _, c := range h.view.Clients {
		if c.Health == Healthy {
			n++
		}
	}
	return Summary{ID: h.view.ID, Name: h.view.Name, State: h.view.State, Epoch: h.view.Epoch, Step: h.view.Step, Clients: n, Error: h.view.Error}
}
