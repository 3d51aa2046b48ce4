package drive

import (
	"errors"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/node/machine"
)

// ErrNoData is what an effect's error wraps when the node could not read
// the run's data for it (the data server did not answer in time, or the
// file cannot be read): the node sits the round out (Machine.SatOut), or
// leaves a result unscored, and goes on; it does not stop.
var ErrNoData = errors.New("drive: the run's data could not be read")

// NotLoaded is the error of a load whose source did not give the model:
// the machine hears of it (Machine.LoadFailed) and chooses the next try.
type NotLoaded struct {
	Why machine.LoadFailure
	// At is when the load failed (unix seconds of the node's clock).
	At  uint64
	Err error
}

func (e *NotLoaded) Error() string { return e.Err.Error() }
func (e *NotLoaded) Unwrap() error { return e.Err }

// Step is what an effect that may take a while says it did.
type Step int

const (
	// Done: the effect is finished; the driver goes on.
	Done Step = iota
	// Again: the effect could not start yet (it waits for earlier work, a
	// gradient trained ahead); the driver pauses and, on Resume, asks for
	// the same effect again.
	Again
	// Later: the effect has started and ends later; the driver pauses and,
	// on Resume, goes on with what follows it.
	Later
)

// Effects does the work a Ready asks for. The methods that return a Step
// may pause the driver (a simulator's modelled compute); a real node does
// the work before returning and always says Done. The others never pause:
// what they start answers later, as an event (a fetch, a pull, a tick).
type Effects interface {
	// Apply applies a round's consensus results (Ready.Apply).
	Apply(w *machine.ApplyWork) (Step, error)
	// Load makes the epoch's model, optimizer and data ready from the
	// source w names (Ready.Load). A *NotLoaded error says that source did
	// not give the model, and why: the machine decides what next
	// (LoadFailed). Any other error stops the node.
	Load(w *machine.LoadWork) (Step, error)
	// TrainAhead starts w's gradient in the background (TrainWork.Ahead).
	TrainAhead(w machine.TrainWork) (Step, error)
	// Train is the time the batch's gradient takes (a gradient trained
	// ahead may already hold it); Trained follows once it is Done.
	Train(w *machine.TrainWork) (Step, error)
	// Trained publishes the node's result for w and returns what the
	// machine's Trained takes; an error wrapping ErrNoData: the node sat
	// the round out.
	Trained(w *machine.TrainWork) (p2p.Announcement, *distro.Frame, machine.TrainStats, error)
	// ReferenceLosses measures the losses of w.Reference on the model the
	// round was trained on, before anything changes it (ErrNoData: the
	// reports stay unchecked).
	ReferenceLosses(w *machine.TrainWork) (map[uint64]float32, error)
	// Verify scores a sampled result (Ready.Verify; ErrNoData: it stays
	// unscored).
	Verify(w machine.VerifyWork) (score, drop float32, scored bool, err error)

	// Send queues instructions for the coordinator, sent in this order.
	Send(ixs []coordinator.Instruction)
	// DropFetches cancels the fetches in flight and waiting.
	DropFetches()
	// Fetch queues announced results to fetch; each answers Fetched.
	Fetch(anns []p2p.Announcement)
	// Report tells the network of peers caught equivocating.
	Report(peers []coordinator.Pubkey)
	// Checked records the verdicts on sampled loss reports.
	Checked(reports []machine.ReportChecked)
	// Refused records the results the witness rules refused.
	Refused(results []machine.RefusedResult)
	// Pull asks the peers for a step's announcements; it answers Pulled.
	Pull(step uint32)
	// Share serves the model to the joiners of an epoch.
	Share(epoch uint32)
	// Save saves the model as the epoch's checkpoint.
	Save(w machine.SaveWork)
	// Tick sends a tick instruction; it answers TickSent.
	Tick()
}

// Where the driver is in the Ready at the head of its queue, in field
// order.
type phase int

const (
	phaseApply phase = iota
	phaseLoad
	phaseTrain
	phaseTrained
	phaseRest
)

// Driver carries out a machine's Readies through Effects.
type Driver struct {
	m  *machine.Machine
	fx Effects

	anns, inbox []func() machine.Ready // events not taken yet
	work        []machine.Ready        // the Ready being done, then those queued after it
	next        []machine.Ready        // what the head's work answered with so far
	phase       phase
	paused      bool
	done        string
}

// New returns a driver of m whose work fx does.
func New(m *machine.Machine, fx Effects) *Driver { return &Driver{m: m, fx: fx} }

// ErrPaused is Do's answer when an effect paused: Do is for drivers whose
// effects finish before they return.
var ErrPaused = errors.New("drive: an effect paused under Do")

// Do carries out rd and then, in order, every Ready that its work answered
// with: a queue, not a recursion, so each Ready is done whole, in field
// order, before the next.
func (d *Driver) Do(rd machine.Ready) error {
	d.work = append(d.work, rd)
	if err := d.Pump(); err != nil {
		return err
	}
	if d.paused {
		return ErrPaused
	}
	return nil
}

// Announce queues an announcement's event. Announcements go before every
// other event: one may be a trainer's second, conflicting result
// (equivocation), which must be known before a fetched result completes a
// witness report that would vouch for the first.
func (d *Driver) Announce(ev func() machine.Ready) { d.anns = append(d.anns, ev) }

// Post queues an event; the machine takes it when the driver is free.
func (d *Driver) Post(ev func() machine.Ready) { d.inbox = append(d.inbox, ev) }

// Paused says whether an effect holds the driver (until Resume).
func (d *Driver) Paused() bool { return d.paused }

// Done is why the machine said to stop ("" until it has).
func (d *Driver) Done() string { return d.done }

// Resume goes on after the effect that paused the driver has ended.
func (d *Driver) Resume() error {
	d.paused = false
	return d.Pump()
}

// Pump does the queued work and takes queued events until an effect
// pauses, nothing is left, the machine says to stop or an effect fails.
func (d *Driver) Pump() error {
	for !d.paused && d.done == "" {
		if len(d.work) > 0 {
			if err := d.advance(); err != nil {
				return err
			}
			continue
		}
		var ev func() machine.Ready
		switch {
		case len(d.anns) > 0:
			ev, d.anns = d.anns[0], d.anns[1:]
		case len(d.inbox) > 0:
			ev, d.inbox = d.inbox[0], d.inbox[1:]
		default:
			return nil
		}
		d.work = append(d.work, ev())
	}
	return nil
}

// pause records what an effect said: it reports whether the driver must
// stop here, and moves past the effect unless it asked to be called again.
func (d *Driver) pause(s Step, after phase) bool {
	switch s {
	case Again:
		d.paused = true
		return true
	case Later:
		d.paused = true
		d.phase = after
		return true
	}
	d.phase = after
	return false
}

// advance does the head of the queue from its phase on, until it is done
// or an effect pauses.
func (d *Driver) advance() error {
	rd := &d.work[0]
	for {
		switch d.phase {
		case phaseApply:
			if rd.Apply == nil {
				d.phase = phaseLoad
				continue
			}
			s, err := d.fx.Apply(rd.Apply)
			if err != nil {
				return err
			}
			if d.pause(s, phaseLoad) {
				return nil
			}
		case phaseLoad:
			if rd.Load == nil {
				d.phase = phaseTrain
				continue
			}
			s, err := d.fx.Load(rd.Load)
			var nl *NotLoaded
			switch {
			case errors.As(err, &nl):
				d.next = append(d.next, d.m.LoadFailed(rd.Load.Epoch, rd.Load.Source, nl.Why, nl.At))
			case err != nil:
				return err
			case s != Again:
				d.next = append(d.next, d.m.Loaded(rd.Load.Epoch))
			}
			if d.pause(s, phaseTrain) {
				return nil
			}
		case phaseTrain:
			w := rd.Train
			if w == nil {
				d.phase = phaseRest
				continue
			}
			if w.Ahead {
				s, err := d.fx.TrainAhead(*w)
				if err != nil {
					return err
				}
				if d.pause(s, phaseRest) {
					return nil
				}
				continue
			}
			s, err := d.fx.Train(w)
			if err != nil {
				return err
			}
			if d.pause(s, phaseTrained) {
				return nil
			}
		case phaseTrained:
			w := rd.Train
			a, f, st, err := d.fx.Trained(w)
			if errors.Is(err, ErrNoData) {
				// Nothing trained, nothing published: the reports this
				// node would check against its own losses stay unchecked.
				d.next = append(d.next, d.m.SatOut(w.Step))
				d.phase = phaseRest
				continue
			}
			if err != nil {
				return err
			}
			d.next = append(d.next, d.m.Trained(a, f, st))
			if len(w.Reference) > 0 {
				// Before the Apply that Trained's Ready may hold: the model
				// is still the one the round trained on.
				ref, err := d.fx.ReferenceLosses(w)
				switch {
				case errors.Is(err, ErrNoData):
					// The sampled reports stay unchecked.
				case err != nil:
					return err
				default:
					d.next = append(d.next, d.m.ReferenceLosses(w.Step, ref))
				}
			}
			d.phase = phaseRest
		case phaseRest:
			if err := d.rest(rd); err != nil {
				return err
			}
			d.work = append(d.work[1:], d.next...)
			d.next = nil
			d.phase = phaseApply
			return nil
		}
	}
}

// rest does the fields of a Ready that never pause, in field order.
func (d *Driver) rest(rd *machine.Ready) error {
	for _, w := range rd.Verify {
		score, drop, scored, err := d.fx.Verify(w)
		if errors.Is(err, ErrNoData) {
			continue // left unscored: no verdict either way
		}
		if err != nil {
			return err
		}
		d.next = append(d.next, d.m.Verified(w.Trainer, score, drop, scored))
	}
	if len(rd.Send) > 0 {
		d.fx.Send(rd.Send)
	}
	if rd.DropFetches {
		d.fx.DropFetches()
	}
	// Even with nothing new: a fetch that ended may have freed a slot.
	d.fx.Fetch(rd.Fetch)
	if len(rd.Report) > 0 {
		d.fx.Report(rd.Report)
	}
	if len(rd.Reports) > 0 {
		d.fx.Checked(rd.Reports)
	}
	if len(rd.Refused) > 0 {
		d.fx.Refused(rd.Refused)
	}
	if rd.Pull != nil {
		d.fx.Pull(*rd.Pull)
	}
	if rd.Share != nil {
		d.fx.Share(*rd.Share)
	}
	if rd.Save != nil {
		d.fx.Save(*rd.Save)
	}
	if rd.Tick {
		d.fx.Tick()
	}
	if rd.Done != "" {
		d.done = rd.Done
	}
	return nil
}
