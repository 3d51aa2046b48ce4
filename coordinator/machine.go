package coordinator

import (
	"crypto/sha256"
	"errors"
	"fmt"
)

// Context carries what an instruction is applied with: who signed it and the
// two inputs that are not deterministic, which the backend supplies (the chain
// clock and a seed derived from chain data, or the server's clock and random
// source).
type Context struct {
	Sender   Pubkey // the instruction's signer
	CoSigner Pubkey // a second signer (the join authority), zero if none
	Now      uint64 // unix seconds
	Seed     uint64 // randomness for a round that this instruction may start
}

// Result says what an instruction did.
type Result struct {
	Changed bool     // the state was mutated and the nonce bumped
	From    RunState // run state before
	To      RunState // run state after
}

// Apply executes one instruction. It either mutates the state (bumping the
// nonce) and returns a nil error, or leaves the state untouched and returns a
// coordinator error; it never panics, whatever the instruction holds.
func (s *Coordinator) Apply(ctx Context, ix Instruction) (Result, error) {
	res := Result{From: s.RunState}
	var changed bool
	var err error
	switch ix := ix.(type) {
	case *InitCoordinator:
		changed, err = s.initCoordinator(ctx, ix)
	case *Update:
		changed, err = s.update(ctx, ix)
	case *SetPaused:
		changed, err = s.setPaused(ctx, ix.Paused)
	case *JoinRun:
		changed, err = s.joinRun(ctx, ix.ID)
	case *Tick:
		changed, err = s.Tick(ctx.Now, ctx.Seed)
	case *WarmupWitness:
		changed, err = s.warmupWitness(ctx, &ix.Report)
	case *WitnessRound:
		changed, err = s.witness(ctx, &ix.Report)
	case *HealthCheck:
		changed, err = s.healthCheck(ctx, ix.ID, ix.Proof)
	case *RecordCheckpoint:
		changed, err = s.checkpoint(ctx, &ix.Source)
	case *FreeCoordinator:
		err = s.free(ctx)
	default:
		err = ErrUnknownInstruction
	}
	if err != nil {
		return Result{From: res.From, To: s.RunState}, err
	}
	if _, isTick := ix.(*Tick); changed && !isTick {
		// Tick bumps the nonce itself, so that backends can call it directly.
		s.Nonce++
	}
	res.Changed = changed
	res.To = s.RunState
	return res, nil
}

// New returns a run created by init_coordinator, signed by its main
// authority.
func New(ix InitCoordinator) (*Coordinator, error) {
	s := new(Coordinator)
	if _, err := s.initCoordinator(Context{Sender: ix.MainAuthority}, &ix); err != nil {
		return nil, err
	}
	s.Nonce = 1
	return s, nil
}

// initCoordinator creates the run. The main authority must be the sender:
// otherwise anyone could create a run in someone else's name (and, on chain,
// spend the rent of an account that the named authority alone can free).
func (s *Coordinator) initCoordinator(ctx Context, ix *InitCoordinator) (bool, error) {
	if !s.MainAuthority.IsZero() {
		return false, ErrAlreadyInitialized
	}
	if !validRunID(ix.RunID) {
		return false, fmt.Errorf("%w: %q", ErrInvalidRunID, FixedString(ix.RunID[:]))
	}
	if ix.MainAuthority.IsZero() {
		return false, ErrInvalidAuthority
	}
	if ctx.Sender != ix.MainAuthority {
		return false, ErrUnauthorized
	}
	*s = Coordinator{RunID: ix.RunID, MainAuthority: ix.MainAuthority, JoinAuthority: ix.JoinAuthority}
	return true, nil
}

// timedOut is the one timeout rule: d seconds have passed since the state
// began, and never in the second the state began (so a zero timeout still
// gives clients one second to see the state).
func (s *Coordinator) timedOut(now, d uint64) bool {
	return now > s.RunStateStart && now-s.RunStateStart >= d
}

func (s *Coordinator) setState(st RunState, now uint64) {
	s.RunState = st
	s.RunStateStart = now
}

// Tick advances the run if a timeout has passed or a condition has been met,
// bumping the nonce, and reports true. When nothing is due it returns
// ErrNothingDue and leaves the state alone, like every other refused
// instruction: on chain a tick that would change nothing then fails in the
// preflight simulation and costs its sender no fee (anyone may tick, and
// every trainer ticks when its copy of the run says a transition is due, so
// all but the first of those ticks find nothing to do), and no transaction
// lands that did nothing. Backends that tick on a timer treat ErrNothingDue
// as "not yet". It does not allocate.
func (s *Coordinator) Tick(now, seed uint64) (bool, error) {
	changed := false
	switch s.RunState {
	case Uninitialized, Paused, Finished:
		return false, ErrHalted
	case WaitingForMembers:
		if s.PendingLen >= s.Config.InitMinClients && s.timedOut(now, s.Config.WaitingForMembersExtraTime) {
			s.startWarmup(now, seed)
			changed = true
		}
	case Warmup:
		changed = s.tickWarmup(now, seed)
	case RoundTrain:
		r := s.CurrentRound()
		if s.timedOut(now, s.Config.MaxRoundTrainTime) || s.witnessesIn(r) {
			s.setState(RoundWitness, now)
			changed = true
		}
	case RoundWitness:
		// The witness window is slack for late witnesses: with every
		// witness in, nobody is late, and the round ends at this tick.
		// The seed still comes from the tick, never from a witness
		// report (see endRound for why that gives the last witness no
		// new say in it).
		if s.timedOut(now, s.Config.RoundWitnessTime) || s.witnessesIn(s.CurrentRound()) {
			s.endRound(now, seed)
			changed = true
		}
	case Cooldown:
		if s.timedOut(now, s.Config.CooldownTime) || s.Epoch.Checkpointed {
			s.endEpoch(now)
			changed = true
		}
	}
	if !changed {
		return false, ErrNothingDue
	}
	s.Nonce++
	return true, nil
}

// SitsOut reports whether the pending joiner signer would be left out of
// the next epoch if it started now (admitted): status and the trainer say
// so before it happens, by the warmup's own rule.
func (s *Coordinator) SitsOut(signer Pubkey) bool {
	i, ok := s.PendingIndex(signer)
	if !ok {
		return false
	}
	keep := s.admitted()
	return !keep[i]
}

// startWarmup begins an epoch with the pending joiners.
func (s *Coordinator) startWarmup(now, seed uint64) {
	e := &s.Epoch
	// The previous epoch's clients hold the latest model. If none of them is
	// coming back, nobody can serve it over P2P: fall back to the URL.
	if s.Model.Checkpoint.Kind == CheckpointP2P {
		holder := false
		for i := uint16(0); i < e.ClientsLen && !holder; i++ {
			_, holder = s.PendingIndex(e.Clients[i].ID.Signer)
		}
		if !holder {
			s.Model.Checkpoint.Kind = CheckpointHub
		}
	}
	keep := s.admitted() // before the exited list, which says who sits out, starts afresh
	prev := e.ClientsLen
	copy(e.Exited[:prev], e.Clients[:prev])
	clear(e.Exited[prev:max(prev, e.ExitedLen)])
	e.ExitedLen = prev
	e.Rounds = [NumRounds]Round{}
	n := uint16(0)
	for i := uint16(0); i < s.PendingLen; i++ {
		if keep[i] {
			e.Clients[n] = Client{ID: s.Pending[i]}
			n++
		}
	}
	clear(e.Clients[n:max(n, prev)])
	e.ClientsLen = n
	clear(s.Pending[:s.PendingLen])
	s.PendingLen = 0
	e.StartTimestamp = now
	e.StartStep = s.Progress.Step
	e.LastStep = 0
	e.CurrentRound = 0
	e.FirstRound = true
	e.Checkpointed = false
	// ColdStart is kept: it says how this epoch must load the model.
	// The warmup round (slot 0) elects the warmup witnesses; the first
	// training round replaces it.
	e.Rounds[0] = Round{DataIndex: s.Progress.EpochStartDataIndex, RandomSeed: seed, ClientsLen: n}
	s.NextRoundSeed = FirstRoundSeed(seed)
	s.setState(Warmup, now)
}

// admitted marks the pending joiners that the epoch about to start takes:
// every one but those a health check dropped in the epoch that ends
// (SittingOut), who sit this one out, unless fewer than min_clients would
// be left without them (a run must not stall for want of the trainers it
// turned away). They may join the epoch after: its warmup starts the exited
// list afresh. They still count towards init_min_clients (they did join),
// so an epoch may start with fewer than init_min_clients, never with fewer
// than min_clients.
func (s *Coordinator) admitted() (keep [MaxClients]bool) {
	kept := uint16(0)
	for i := uint16(0); i < s.PendingLen; i++ {
		if keep[i] = !s.SittingOut(s.Pending[i].Signer); keep[i] {
			kept++
		}
	}
	if kept < s.PendingLen && kept < s.Config.MinClients {
		for i := uint16(0); i < s.PendingLen; i++ {
			keep[i] = true
		}
	}
	return keep
}

func (s *Coordinator) tickWarmup(now, seed uint64) bool {
	if s.HealthyClients() < s.Config.MinClients {
		s.withdrawAll()
		if s.Progress.Step >= s.Config.TotalSteps {
			s.setState(Finished, now)
		} else {
			s.setState(WaitingForMembers, now)
		}
		return true
	}
	r := s.CurrentRound()
	if s.timedOut(now, s.Config.WarmupTime) || uint16(r.WitnessesLen) >= s.Config.WitnessCount(r.ClientsLen) {
		s.startRoundTrain(now, seed)
		return true
	}
	return false
}

// startRoundTrain begins the next round of the epoch. Clients that are no
// longer healthy leave the list first, so every listed client of a round is a
// trainer of it. The round takes the seed drawn when the previous one began
// (NextRoundSeed), and seed becomes the next round's: a round's data
// assignment is knowable one round before it starts.
func (s *Coordinator) startRoundTrain(now, seed uint64) {
	e := &s.Epoch
	s.exitUnhealthy()
	var slot uint8
	var height uint32
	dataIndex := s.Progress.EpochStartDataIndex
	if !e.FirstRound {
		prev := s.CurrentRound()
		slot = (e.CurrentRound + 1) % NumRounds
		height = prev.Height + 1
		dataIndex = prev.DataIndex + uint64(s.RoundBatchSize(prev))
	}
	e.Rounds[slot] = Round{DataIndex: dataIndex, RandomSeed: s.NextRoundSeed, Height: height, ClientsLen: e.ClientsLen}
	s.NextRoundSeed = seed
	e.CurrentRound = slot
	s.setState(RoundTrain, now)
}

// endRound closes the current round when its witness time is over, or at
// the first tick after every witness is in.
//
// Ending as soon as the witnesses are in gives the last witness no new say
// in the seed this tick draws (next_round_seed, round h+2's). Nothing in a
// witness report feeds the seed: the backend draws it when the tick runs (the
// server from its random source; the program from the tick's slot, its
// clock, the account key and the nonce). All the last witness chooses is
// when its report lands, and it chose that before too: the witness window
// began at its report, so the report's time fixed when the round would end,
// and delaying the report (up to max_round_train_time) already picked among
// candidate ticks, one per second or slot of delay. What is gone is only a
// fixed wait after that choice; the tick that follows is the same "anyone
// may tick, the first tick wins" race as every other transition.
//
// Health checks stay sound: a health check names the previous round, and
// the coordinator judges it against the previous round as it stands when the
// check lands. One that lands after this round ended is judged against the
// round that just ended: its proof, drawn from the old round's seed, is
// refused unless it happens to match, and then it drops the client only if
// that round's witnesses did not see it either. A client that stays dead
// misses the next round too, so its health score fails again there and that
// round's witnesses check it anew (a trainer computes its checks afresh each
// round); a late or refused check only delays the drop by a round. When a
// witness is dead the round waits for max_round_train_time and then the
// full witness window, as before.
func (s *Coordinator) endRound(now, seed uint64) {
	e := &s.Epoch
	e.FirstRound = false
	s.Progress.Step++
	s.exitUnhealthy()
	r := s.CurrentRound()
	if r.WitnessesLen == 0 {
		// Nobody vouched for the round: the epoch cannot go on.
		s.withdrawAll()
		s.setState(Cooldown, now)
		return
	}
	if e.LastStep == 0 && now >= e.StartTimestamp && now-e.StartTimestamp >= s.Config.EpochTime {
		// Two more rounds, so that the results in flight are applied.
		e.LastStep = s.Progress.Step + 2
	}
	if s.Progress.Step == e.LastStep ||
		e.ClientsLen < s.Config.MinClients ||
		uint16(r.WitnessesLen) < Quorum(s.Config.WitnessCount(r.ClientsLen)) ||
		s.Progress.Step >= s.Config.TotalSteps ||
		s.PendingPause {
		s.setState(Cooldown, now)
		return
	}
	s.startRoundTrain(now, seed)
}

// endEpoch closes the cooldown and moves to the next epoch.
func (s *Coordinator) endEpoch(now uint64) {
	r := s.CurrentRound()
	s.Progress.EpochStartDataIndex = r.DataIndex + uint64(s.RoundBatchSize(r))
	s.Progress.Epoch++
	if s.Model.Checkpoint.Kind == CheckpointHub {
		// The epoch's clients now hold a newer model than the URL (unless a
		// checkpoint was just recorded there); joiners fetch from them, and
		// the URL stays as the fallback.
		s.Model.Checkpoint.Kind = CheckpointP2P
	}
	switch {
	case s.Progress.Step >= s.Config.TotalSteps:
		s.PendingPause = false
		s.setState(Finished, now)
	case s.PendingPause:
		s.PendingPause = false
		s.Epoch.ColdStart = true
		s.setState(Paused, now)
	default:
		s.setState(WaitingForMembers, now)
	}
}

// exitUnhealthy moves clients that are no longer healthy from the epoch list
// to the exited list, keeping the order of the rest.
func (s *Coordinator) exitUnhealthy() {
	e := &s.Epoch
	kept := uint16(0)
	for i := uint16(0); i < e.ClientsLen; i++ {
		c := e.Clients[i]
		if c.State == Healthy {
			e.Clients[kept] = c
			kept++
			continue
		}
		if e.ExitedLen < MaxExitedClients { // always true: see MaxExitedClients
			e.Exited[e.ExitedLen] = c
			e.ExitedLen++
		}
	}
	clear(e.Clients[kept:e.ClientsLen])
	e.ClientsLen = kept
}

// withdrawAll marks every healthy client withdrawn. They stay listed until the
// next epoch starts, so that the P2P checkpoint logic still knows who holds
// the model.
func (s *Coordinator) withdrawAll() {
	e := &s.Epoch
	h := s.CurrentRound().Height
	for i := uint16(0); i < e.ClientsLen; i++ {
		if e.Clients[i].State == Healthy {
			e.Clients[i].State = Withdrawn
			e.Clients[i].ExitedHeight = h
		}
	}
}

func (s *Coordinator) update(ctx Context, ix *Update) (bool, error) {
	if ctx.Sender != s.MainAuthority {
		return false, ErrUnauthorized
	}
	if s.RunState == Finished {
		return false, ErrFinished
	}
	if (ix.Config != nil || ix.Model != nil || ix.Progress != nil) && !s.RunState.Halted() {
		return false, ErrNotHalted
	}
	if ix.Config != nil {
		if err := ix.Config.Validate(); err != nil {
			return false, err
		}
	}
	if ix.Model != nil {
		if err := ix.Model.Validate(); err != nil {
			return false, err
		}
	}
	if ix.Metadata != nil {
		s.Metadata = *ix.Metadata
	}
	if ix.Config != nil {
		s.Config = *ix.Config
	}
	if ix.Model != nil {
		s.Model = *ix.Model
	}
	if ix.Progress != nil {
		s.Progress = *ix.Progress
	}
	return true, nil
}

func (s *Coordinator) setPaused(ctx Context, paused bool) (bool, error) {
	if ctx.Sender != s.MainAuthority {
		return false, ErrUnauthorized
	}
	if s.RunState == Finished {
		return false, ErrFinished
	}
	if paused {
		switch s.RunState {
		case RoundTrain, RoundWitness, Cooldown:
			if s.PendingPause {
				return false, ErrAlreadyPaused
			}
			s.PendingPause = true
		case WaitingForMembers, Warmup:
			s.withdrawAll()
			s.Epoch.ColdStart = true
			s.setState(Paused, ctx.Now)
		default:
			return false, ErrAlreadyPaused
		}
		return true, nil
	}
	switch s.RunState {
	case Paused, Uninitialized:
		if err := errors.Join(s.Config.Validate(), s.Model.Validate()); err != nil {
			return false, err
		}
		step := s.Progress.Step
		if step == 0 {
			step = 1 // a new run starts at step 1
		}
		if step >= s.Config.TotalSteps {
			return false, fmt.Errorf("%w: step %d has reached total_steps %d", ErrInvalidProgress, step, s.Config.TotalSteps)
		}
		s.Progress.Step = step
		s.setState(WaitingForMembers, ctx.Now)
		return true, nil
	}
	if s.PendingPause {
		s.PendingPause = false
		return true, nil
	}
	return false, ErrNotPaused
}

func (s *Coordinator) joinRun(ctx Context, id ClientID) (bool, error) {
	switch s.RunState {
	case Finished:
		return false, ErrFinished
	case Uninitialized:
		return false, ErrWrongState
	}
	if id.Signer.IsZero() || id.P2P.IsZero() {
		return false, ErrInvalidClientID
	}
	if id.Signer != ctx.Sender {
		return false, ErrSignerMismatch
	}
	if !s.JoinAuthority.IsZero() && ctx.CoSigner != s.JoinAuthority && ctx.Sender != s.JoinAuthority {
		return false, ErrJoinNotAuthorized
	}
	existing, already := s.PendingIndex(id.Signer)
	for i := uint16(0); i < s.PendingLen; i++ {
		if s.Pending[i].P2P == id.P2P && s.Pending[i].Signer != id.Signer {
			return false, ErrDuplicateP2PIdentity
		}
	}
	if already {
		s.Pending[existing].P2P = id.P2P
		return true, nil
	}
	if s.PendingLen >= MaxClients || s.PendingLen >= s.Config.GlobalBatchSizeEnd {
		return false, fmt.Errorf("%w: %d pending, global_batch_size_end is %d", ErrPendingFull, s.PendingLen, s.Config.GlobalBatchSizeEnd)
	}
	s.Pending[s.PendingLen] = id
	s.PendingLen++
	return true, nil
}

// verifyProof checks a witness proof against round r: the index names the
// sender, the position is the one the seed gives, and the client is a witness.
func (s *Coordinator) verifyProof(r *Round, sender Pubkey, p WitnessProof) error {
	if p.Index >= r.ClientsLen || p.Index >= s.Epoch.ClientsLen {
		return fmt.Errorf("%w: index %d, round has %d clients", ErrInvalidProof, p.Index, r.ClientsLen)
	}
	c := &s.Epoch.Clients[p.Index]
	if c.ID.Signer != sender {
		return fmt.Errorf("%w: client %d is not the sender", ErrInvalidProof, p.Index)
	}
	if c.State != Healthy {
		return ErrClientNotHealthy
	}
	want := s.Config.WitnessProofFor(r, p.Index)
	if p != want {
		return fmt.Errorf("%w: position %d, want %d", ErrInvalidProof, p.Position, want.Position)
	}
	if !p.IsWitness {
		return ErrNotAWitness
	}
	for i := 0; i < int(r.WitnessesLen); i++ {
		if r.Witnesses[i].Proof.Index == p.Index {
			return ErrDuplicateWitness
		}
	}
	if r.WitnessesLen >= MaxWitnesses {
		return ErrWitnessesFull
	}
	return nil
}

// witnessesIn reports whether every elected witness of round r that can
// still report has: one that is no longer healthy (a health check dropped
// it) cannot send a report, so the round must not wait for it until its
// training limit. Only clients that are not healthy are shuffled, so the
// common case costs nothing.
func (s *Coordinator) witnessesIn(r *Round) bool {
	want := s.Config.WitnessCount(r.ClientsLen)
	got := uint16(r.WitnessesLen)
	n := min(r.ClientsLen, s.Epoch.ClientsLen)
	for i := uint16(0); i < n && got < want; i++ {
		if s.Epoch.Clients[i].State == Healthy || r.WitnessPosition(i) >= want {
			continue
		}
		reported := false
		for j := uint8(0); j < r.WitnessesLen; j++ {
			reported = reported || r.Witnesses[j].Proof.Index == i
		}
		if !reported {
			got++
		}
	}
	return got >= want
}

func (s *Coordinator) warmupWitness(ctx Context, w *Witness) (bool, error) {
	if s.RunState != Warmup {
		return false, ErrWrongState
	}
	r := s.CurrentRound()
	if err := s.verifyProof(r, ctx.Sender, w.Proof); err != nil {
		return false, err
	}
	r.Witnesses[r.WitnessesLen] = *w
	r.WitnessesLen++
	s.tickWarmup(ctx.Now, ctx.Seed)
	return true, nil
}

func (s *Coordinator) witness(ctx Context, w *Witness) (bool, error) {
	if s.RunState != RoundTrain && s.RunState != RoundWitness {
		return false, ErrWrongState
	}
	r := s.CurrentRound()
	if err := s.verifyProof(r, ctx.Sender, w.Proof); err != nil {
		return false, err
	}
	if w.Metadata.Step != s.Progress.Step {
		return false, fmt.Errorf("%w: witness is for step %d, the run is at step %d", ErrWrongStep, w.Metadata.Step, s.Progress.Step)
	}
	r.Witnesses[r.WitnessesLen] = *w
	r.WitnessesLen++
	if s.RunState == RoundTrain && s.witnessesIn(r) {
		// Every witness has seen every result: no need to wait for the timeout.
		s.setState(RoundWitness, ctx.Now)
	}
	return true, nil
}

func (s *Coordinator) healthCheck(ctx Context, id ClientID, p WitnessProof) (bool, error) {
	if s.RunState != RoundTrain && s.RunState != RoundWitness {
		return false, ErrWrongState
	}
	si, ok := s.ClientIndex(ctx.Sender)
	if !ok || s.Epoch.Clients[si].State != Healthy {
		return false, ErrNotAClient
	}
	prev := s.PreviousRound()
	if prev == nil {
		return false, ErrNoPreviousRound
	}
	r := s.CurrentRound()
	if p.Index >= r.ClientsLen || p.Index >= s.Epoch.ClientsLen || s.Epoch.Clients[p.Index].ID != id {
		return false, fmt.Errorf("%w: index %d does not name that client", ErrInvalidProof, p.Index)
	}
	if want := s.Config.HealthCheckProofFor(r, p.Index); p != want {
		return false, fmt.Errorf("%w: position %d, want %d", ErrInvalidProof, p.Position, want.Position)
	}
	if _, err := s.Config.CommitteeOf(uint64(p.Position)); err != nil {
		return false, err
	}
	target := &s.Epoch.Clients[p.Index]
	if target.State != Healthy {
		return false, ErrClientNotHealthy
	}
	if HealthScore(prev, id.Signer) >= Quorum(s.Config.WitnessCount(prev.ClientsLen)) {
		return false, ErrClientHealthy
	}
	target.State = Dropped
	target.ExitedHeight = r.Height
	return true, nil
}

func (s *Coordinator) checkpoint(ctx Context, src *CheckpointSource) (bool, error) {
	if s.RunState != Cooldown {
		return false, ErrWrongState
	}
	if s.Epoch.Checkpointed {
		return false, ErrAlreadyCheckpointed
	}
	if FixedString(src.URL[:]) == "" || !canonicalFixed(src.URL[:]) || !canonicalFixed(src.Revision[:]) {
		return false, ErrInvalidCheckpoint
	}
	if ctx.Sender != s.MainAuthority {
		i, ok := s.ClientIndex(ctx.Sender)
		if !ok || s.Epoch.Clients[i].State != Healthy {
			return false, ErrNotAClient
		}
		if !s.IsCheckpointer(i) {
			return false, ErrNotCheckpointer
		}
	}
	s.Model.Checkpoint = Checkpoint{Kind: CheckpointHub, Source: *src}
	s.Epoch.Checkpointed = true
	return true, nil
}

func (s *Coordinator) free(ctx Context) error {
	if ctx.Sender != s.MainAuthority {
		return ErrUnauthorized
	}
	if !s.RunState.Halted() {
		return ErrNotHalted
	}
	return nil
}

// ParticipantMember is the element a witness adds to its participant bloom
// for a trainer: sha256 of the trainer's signer key.
func ParticipantMember(signer Pubkey) Hash { return sha256.Sum256(signer[:]) }
