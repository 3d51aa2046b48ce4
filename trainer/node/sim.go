package node

import (
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
)

// Machine is the trainer's decision machine for a driver other than
// Node.Run: internal/simscale plays hundreds of trainers in virtual time
// with it, feeding the same events Node.Run feeds and doing what each Ready
// says. It adds no decision of its own; each method is the event of the
// same name in machine.go.
type Machine struct{ m *machine }

// NewMachine returns the machine of client id, which leaves after epochs
// epochs (0: never) and draws its witness bloom keys from newKey. It does
// not tick the run (a server backend ticks itself).
func NewMachine(id coordinator.ClientID, epochs int, newKey func() uint64) *Machine {
	return &Machine{m: newMachine(id, epochs, false, newKey)}
}

// Snapshot takes a coordinator state. The machine keeps s and reads it
// until the next snapshot, but never writes it, so drivers may hand one
// state to many machines.
func (x *Machine) Snapshot(s *coordinator.Coordinator) Ready { return x.m.snapshot(s) }

// Loaded says the model of epoch is ready (the answer to Ready.Load).
func (x *Machine) Loaded(epoch uint32) Ready { return x.m.loaded(epoch) }

// Announced takes a peer's announcement.
func (x *Machine) Announced(a p2p.Announcement) Ready { return x.m.announced(a) }

// Fetched takes a fetched result (the answer to one of Ready.Fetch): its
// frame, or why it failed and whether the result itself is bad.
func (x *Machine) Fetched(a p2p.Announcement, f *distro.Frame, err error, invalid bool) Ready {
	return x.m.fetched(a, f, err, invalid)
}

// Trained takes this node's own published result (the answer to a
// Ready.Train that is not Ahead) and the loss of its batch.
func (x *Machine) Trained(a p2p.Announcement, f *distro.Frame, loss float32) Ready {
	return x.m.trainedResult(a, f, trainStats{loss: loss})
}

// Tick is the once-a-second tick at now (unix seconds).
func (x *Machine) Tick(now uint64) Ready { return x.m.tick(now) }

// Pulled takes the answer to Ready.Pull.
func (x *Machine) Pulled(list []p2p.Announcement) Ready { return x.m.pulled(list) }
