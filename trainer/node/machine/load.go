package machine

import (
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

// Where an epoch's model comes from is decided here, and a load that did
// not give it comes back as an event (LoadFailed) that moves the decision
// on; the driver loads from the one source a LoadWork names.
//
// The order, for one epoch:
//   - the model in memory stays (LoadKeep) when this node ended the
//     previous epoch holding its final model, the run's model is still of
//     that model's config (the run's authority may have changed it while
//     the run was paused), and the run shares models over P2P; a kept
//     model the driver no longer holds is a failed load (LoadFailed), after
//     which the previous epoch's other holders are asked;
//   - a P2P run's joiner asks the previous epoch's clients (LoadPeers)
//     until one serves it, until every holder has answered that it holds
//     none (a full restart: LoadNoHolder), or until it has asked for the
//     checkpoint wait (holders that are only slow to reach would serve it;
//     ones that never answer must not keep the run from its recorded
//     checkpoint);
//   - then, and in every other run, the run's recorded checkpoint
//     (LoadRecorded: its URL, its store, or a transformers config);
//   - a recorded checkpoint this machine cannot read (a file on another
//     trainer's disk, a bucket whose model is not the recorded one) is
//     taken from a trainer that offers it (LoadOffer), for the rest of the
//     epoch.
//
// A source that may answer later (LoadNotYet) is tried again at the next
// tick while the warmup lasts.

// LoadSource names where a LoadWork takes the epoch's model from.
type LoadSource uint8

const (
	// LoadKeep: the model in memory stays; only the optimizer's rule is
	// renewed (it may have changed while the run was paused).
	LoadKeep LoadSource = iota
	// LoadPeers: the model the previous epoch's clients hold (a P2P
	// checkpoint), as most of them offer it.
	LoadPeers
	// LoadRecorded: the run's recorded checkpoint.
	LoadRecorded
	// LoadOffer: the recorded checkpoint as a trainer that could read it
	// offers it.
	LoadOffer
)

func (s LoadSource) String() string {
	switch s {
	case LoadKeep:
		return "keep"
	case LoadPeers:
		return "peers"
	case LoadRecorded:
		return "recorded"
	case LoadOffer:
		return "offer"
	}
	return "unknown"
}

// LoadFailure says why a load did not give the model.
type LoadFailure uint8

const (
	// LoadNotYet: the source may answer on a later try (holders not
	// reachable yet, no offer made yet, the run's data not open yet).
	LoadNotYet LoadFailure = iota
	// LoadNoHolder: no other client holds the previous epoch's model
	// (every holder said so, or the only one is this node).
	LoadNoHolder
	// LoadUnreadableHere: this machine cannot read the recorded
	// checkpoint, or what it read is not the recorded model; another
	// trainer may.
	LoadUnreadableHere
)

func (f LoadFailure) String() string {
	switch f {
	case LoadNotYet:
		return "not-yet"
	case LoadNoHolder:
		return "no-holder"
	case LoadUnreadableHere:
		return "unreadable-here"
	}
	return "unknown"
}

// loadBook is what the node learnt of the epoch's sources.
type loadBook struct {
	// peersSince is when a load from peers first failed without an answer
	// (unix seconds; 0: none has).
	peersSince uint64
	// peersGaveUp: the peers are not asked again this epoch.
	peersGaveUp bool
	// unreadable: the recorded checkpoint cannot be read here this epoch.
	unreadable bool
	// keepLost: the model this node held is gone (the driver could not
	// keep it); its holders are the previous epoch's other clients.
	keepLost bool
}

// CheckpointWait sets how long a joiner asks unreachable holders for the
// previous epoch's model before it loads the recorded checkpoint, in
// seconds (0: half the run's warmup, at least minCheckpointWait).
func (m *Machine) CheckpointWait(seconds uint64) { m.checkpointWait = seconds }

// minCheckpointWait is the least default checkpoint wait, in seconds.
const minCheckpointWait = 5

func (m *Machine) peerWait() uint64 {
	if m.checkpointWait > 0 {
		return m.checkpointWait
	}
	return max(minCheckpointWait, m.snap.Config.WarmupTime/2)
}

// loadWork asks for the model of the snapshot's epoch from the source the
// rules above choose.
func (m *Machine) loadWork() *LoadWork {
	s := m.snap
	book := m.cur() // turn the page: prev is the epoch before
	m.ahead = nil   // the model is replaced (or kept, but a new epoch's rounds are not the ones guessed)
	src := m.recordedSource()
	if s.Model.Checkpoint.Kind == coordinator.CheckpointP2P && !book.load.peersGaveUp {
		src = LoadPeers
		if s.Progress.Epoch > 0 && m.prev.epoch == s.Progress.Epoch-1 && m.prev.keeps(&s.Model) && !book.load.keepLost {
			src = LoadKeep
		}
	}
	return &LoadWork{Epoch: s.Progress.Epoch, Source: src, State: s}
}

// keeps reports whether the model this book's epoch ended holding is a
// model of model's config.
func (b *epochBook) keeps(model *coordinator.Model) bool {
	if !b.held || !b.heldKnown {
		return false
	}
	cfg, err := modelspec.ModelConfig(model)
	return err == nil && cfg == b.heldAs
}

// recordedSource is where the recorded checkpoint comes from: its own
// source, or a trainer's offer once this machine found it unreadable.
func (m *Machine) recordedSource() LoadSource {
	if m.book.load.unreadable {
		return LoadOffer
	}
	return LoadRecorded
}

// LoadFailed takes a load of epoch from source that did not give the model
// (why), at now (unix seconds): the next source is asked for at once when
// the rules move on to one, and otherwise at the next tick.
func (m *Machine) LoadFailed(epoch uint32, source LoadSource, why LoadFailure, now uint64) Ready {
	s := m.snap
	if s == nil || s.Progress.Epoch != epoch || m.book.epoch != epoch || m.book.ready {
		return Ready{}
	}
	lb := &m.book.load
	fromPeers := source == LoadPeers
	switch {
	case source == LoadKeep:
		// The model this node could not keep is the previous epoch's:
		// its other holders are asked at once.
		lb.keepLost = true
	case fromPeers && why == LoadNoHolder:
		lb.peersGaveUp = true
	case fromPeers:
		if lb.peersSince == 0 {
			lb.peersSince = max(now, 1)
		}
		if now >= lb.peersSince+m.peerWait() {
			lb.peersGaveUp = true
		}
		if !lb.peersGaveUp {
			return Ready{} // asked again at the next tick
		}
	case source == LoadRecorded && why == LoadUnreadableHere:
		lb.unreadable = true
	default:
		return Ready{} // asked again at the next tick
	}
	var rd Ready
	if _, ok := m.member(); ok && s.RunState == coordinator.Warmup {
		rd.Load = m.loadWork() // the rules above, with what this failure taught
	}
	return rd
}
