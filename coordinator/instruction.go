package coordinator

import (
	"fmt"
)

// Instruction data is an 8-byte discriminator, sha256("global:<name>")[0:8]
// (the Anchor convention, so explorers decode it from the IDL), followed by the
// arguments in the same little-endian field encoding as the account, with
// Borsh-style options (one tag byte, 0 or 1, then the value if 1). Data must
// be consumed exactly: trailing bytes are an error.

// Instruction is one of the coordinator's instructions.
type Instruction interface {
	// Name is the instruction's snake_case name in the IDL.
	Name() string
	walk(c *cursor)
}

// InitCoordinator creates a run (in Uninitialized, which behaves as paused).
type InitCoordinator struct {
	MainAuthority Pubkey
	JoinAuthority Pubkey // zero: anyone may join
	RunID         [MaxRunIDLen]byte
}

// Update changes the run's description (any time) and its config, model and
// progress (only while halted). Nil fields are left as they are.
type Update struct {
	Metadata *Metadata
	Config   *Config
	Model    *Model
	Progress *Progress
}

// SetPaused pauses (true) or resumes (false) the run.
type SetPaused struct{ Paused bool }

// JoinRun asks to be a client of the next epoch.
type JoinRun struct{ ID ClientID }

// Tick advances the state machine if a timeout or condition has been met.
type Tick struct{}

// WarmupWitness tells that a witness of the warmup round has loaded the model.
type WarmupWitness struct{ Report Witness }

// WitnessRound is a witness's report on the current round (the IDL name is
// "witness").
type WitnessRound struct{ Report Witness }

// HealthCheck reports a client that a quorum of the previous round's witnesses
// did not see. Proof is the client's committee proof in the current round.
type HealthCheck struct {
	ID    ClientID
	Proof WitnessProof
}

// RecordCheckpoint records where this epoch's model was saved (the IDL name
// is "checkpoint").
type RecordCheckpoint struct{ Source CheckpointSource }

// FreeCoordinator closes a halted run.
type FreeCoordinator struct{}

func (*InitCoordinator) Name() string  { return "init_coordinator" }
func (*Update) Name() string           { return "update" }
func (*SetPaused) Name() string        { return "set_paused" }
func (*JoinRun) Name() string          { return "join_run" }
func (*Tick) Name() string             { return "tick" }
func (*WarmupWitness) Name() string    { return "warmup_witness" }
func (*WitnessRound) Name() string     { return "witness" }
func (*HealthCheck) Name() string      { return "health_check" }
func (*RecordCheckpoint) Name() string { return "checkpoint" }
func (*FreeCoordinator) Name() string  { return "free_coordinator" }

func (ix *InitCoordinator) walk(c *cursor) {
	c.pubkey("main_authority", &ix.MainAuthority)
	c.pubkey("join_authority", &ix.JoinAuthority)
	c.bytes("run_id", ix.RunID[:])
}

// option walks a Borsh option: a tag byte and the value when present.
func option[T any](c *cursor, name string, v **T, walk func(*T)) {
	var tag uint8
	if *v != nil {
		tag = 1
	}
	c.u8(name+"?", &tag)
	if c.err != nil {
		return
	}
	switch tag {
	case 0:
		if c.mode == modeDecode {
			*v = nil
		}
	case 1:
		if c.mode == modeDecode {
			*v = new(T)
		}
		c.nest(name, func() { walk(*v) })
	default:
		c.fail("%w: option tag %d for %s", ErrMalformed, tag, name)
	}
}

func (ix *Update) walk(c *cursor) {
	option(c, "metadata", &ix.Metadata, c.metadata)
	option(c, "config", &ix.Config, c.config)
	option(c, "model", &ix.Model, c.model)
	option(c, "progress", &ix.Progress, c.progress)
}

func (ix *SetPaused) walk(c *cursor)        { c.boolean("paused", &ix.Paused) }
func (ix *JoinRun) walk(c *cursor)          { c.nest("id", func() { c.clientID(&ix.ID) }) }
func (*Tick) walk(*cursor)                  {}
func (ix *WarmupWitness) walk(c *cursor)    { c.witness(&ix.Report) }
func (ix *WitnessRound) walk(c *cursor)     { c.witness(&ix.Report) }
func (ix *RecordCheckpoint) walk(c *cursor) { c.checkpointSource(&ix.Source) }
func (*FreeCoordinator) walk(*cursor)       {}
func (ix *HealthCheck) walk(c *cursor) {
	c.nest("id", func() { c.clientID(&ix.ID) })
	c.nest("proof", func() { c.proof(&ix.Proof) })
}

// newInstructions lists a zero value of every instruction, in IDL order.
func newInstructions() []Instruction {
	return []Instruction{&InitCoordinator{}, &Update{}, &SetPaused{}, &JoinRun{}, &Tick{},
		&WarmupWitness{}, &WitnessRound{}, &HealthCheck{}, &RecordCheckpoint{}, &FreeCoordinator{}}
}

// InstructionNames lists every instruction name, in IDL order.
func InstructionNames() []string {
	var names []string
	for _, ix := range newInstructions() {
		names = append(names, ix.Name())
	}
	return names
}

// InstructionDiscriminator is sha256("global:<name>")[0:8].
func InstructionDiscriminator(name string) [8]byte { return discriminator("global:" + name) }

// EncodeInstruction returns the instruction data of ix.
func EncodeInstruction(ix Instruction) []byte {
	d := InstructionDiscriminator(ix.Name())
	c := cursor{mode: modeEncode, buf: d[:], off: 8, grow: true}
	ix.walk(&c)
	if c.err != nil {
		panic(fmt.Sprintf("coordinator: encoding %s: %v", ix.Name(), c.err)) // growing buffers cannot fail
	}
	return c.buf
}

var instructionByDiscriminator = func() map[[8]byte]func() Instruction {
	m := make(map[[8]byte]func() Instruction)
	for _, ix := range newInstructions() {
		name := ix.Name()
		m[InstructionDiscriminator(name)] = func() Instruction {
			for _, fresh := range newInstructions() {
				if fresh.Name() == name {
					return fresh
				}
			}
			return nil
		}
	}
	return m
}()

// DecodeInstruction parses instruction data. It rejects an unknown
// discriminator, short data, trailing bytes and malformed values.
func DecodeInstruction(data []byte) (Instruction, error) {
	if len(data) < 8 {
		return nil, fmt.Errorf("%w: instruction data is %d bytes", ErrTruncated, len(data))
	}
	var d [8]byte
	copy(d[:], data)
	mk, ok := instructionByDiscriminator[d]
	if !ok {
		return nil, fmt.Errorf("%w: discriminator %x", ErrUnknownInstruction, d[:])
	}
	ix := mk()
	c := cursor{mode: modeDecode, buf: data, off: 8}
	ix.walk(&c)
	if c.err != nil {
		return nil, fmt.Errorf("%s: %w", ix.Name(), c.err)
	}
	if c.off != len(data) {
		return nil, fmt.Errorf("%w: %s has %d trailing bytes", ErrMalformed, ix.Name(), len(data)-c.off)
	}
	return ix, nil
}
