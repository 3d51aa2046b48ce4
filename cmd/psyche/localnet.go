package main

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/urfave/cli/v2"
)

var localnetCommand = &cli.Command{
	Name:  "localnet",
	Usage: "run a whole run on this machine with the embedded coordinator",
	Description: `Runs the coordinator state machine with in-process trainers on a simulated clock:
they join, warm up, witness every round and move through epochs exactly as
remote trainers would. Training itself (model, DisTrO, libp2p) is not wired in
yet: the trainers vouch for each other without computing anything.`,
	Flags: []cli.Flag{
		&cli.IntFlag{Name: "trainers", Value: 3, Usage: "number of trainers (1-256)", Category: "RUN"},
		&cli.IntFlag{Name: "epochs", Value: 2, Usage: "epochs to run before stopping", Category: "RUN"},
		&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the simulated round randomness", Category: "RUN"},
	},
	Action: localnet,
}

func localnet(c *cli.Context) error {
	n, epochs := c.Int("trainers"), c.Int("epochs")
	if n < 1 || n > coordinator.MaxClients {
		return fmt.Errorf("--trainers must be between 1 and %d, got %d", coordinator.MaxClients, n)
	}
	if epochs < 1 {
		return fmt.Errorf("--epochs must be at least 1, got %d", epochs)
	}
	out := c.App.Writer
	authority := coordinator.Pubkey(sha256.Sum256([]byte("localnet authority")))
	runID, _ := coordinator.ParseRunID("localnet")
	s, err := coordinator.New(coordinator.InitCoordinator{MainAuthority: authority, RunID: runID})
	if err != nil {
		return err
	}
	cfg, model := localnetConfig(n)
	admin := coordinator.Context{Sender: authority}
	if _, err := s.Apply(admin, &coordinator.Update{Config: &cfg, Model: &model}); err != nil {
		return err
	}
	if _, err := s.Apply(admin, &coordinator.SetPaused{Paused: false}); err != nil {
		return err
	}
	trainers := make([]coordinator.ClientID, n)
	for i := range trainers {
		trainers[i] = coordinator.ClientID{
			Signer: sha256.Sum256(fmt.Appendf(nil, "localnet trainer %d", i)),
			P2P:    sha256.Sum256(fmt.Appendf(nil, "localnet p2p %d", i)),
		}
	}
	rng := rand.New(rand.NewPCG(c.Uint64("seed"), 0x70737963))
	fmt.Fprintf(out, "localnet: %d trainers, %d epochs, run %q (simulated clock, no training yet)\n", n, epochs, s.RunIDString())
	rounds, witnesses := 0, 0
	for now := uint64(1); int(s.Progress.Epoch) < epochs && s.RunState != coordinator.Finished; now++ {
		if now > 100_000 {
			return fmt.Errorf("run did not progress: %s", s.Describe())
		}
		before := s.RunState
		for _, id := range trainers {
			witnesses += act(s, id, now, rng.Uint64())
		}
		if changed, err := s.Tick(now, rng.Uint64()); err != nil {
			return err
		} else if changed || s.RunState != before {
			if s.RunState == coordinator.RoundTrain {
				rounds++
			}
			fmt.Fprintf(out, "t=%5ds  %s\n", now, s.Describe())
		}
	}
	fmt.Fprintf(out, "done: %d epochs, step %d, %d rounds, %d witness reports, nonce %d\n",
		s.Progress.Epoch, s.Progress.Step, rounds, witnesses, s.Nonce)
	return nil
}

// act is what one simulated trainer does in one second; it returns the number
// of witness reports it sent.
func act(s *coordinator.Coordinator, id coordinator.ClientID, now, seed uint64) int {
	ctx := coordinator.Context{Sender: id.Signer, Now: now, Seed: seed}
	switch s.RunState {
	case coordinator.WaitingForMembers:
		if _, pending := s.PendingIndex(id.Signer); !pending {
			_, _ = s.Apply(ctx, &coordinator.JoinRun{ID: id})
		}
		return 0
	case coordinator.Warmup, coordinator.RoundTrain:
		// Results "arrive" two seconds into the phase; then each elected
		// witness reports everyone it heard from.
		if now < s.RunStateStart+2 {
			return 0
		}
		i, ok := s.ClientIndex(id.Signer)
		if !ok {
			return 0
		}
		r := s.CurrentRound()
		w := coordinator.Witness{Proof: s.Config.WitnessProofFor(r, i), Key: seed}
		if !w.Proof.IsWitness {
			return 0
		}
		for j := uint16(0); j < s.Epoch.ClientsLen; j++ {
			w.Participants.Add(w.Key, coordinator.ParticipantMember(s.Epoch.Clients[j].ID.Signer))
		}
		w.Metadata.Step = s.Progress.Step
		var ix coordinator.Instruction = &coordinator.WitnessRound{Report: w}
		if s.RunState == coordinator.Warmup {
			ix = &coordinator.WarmupWitness{Report: w}
		}
		if _, err := s.Apply(ctx, ix); err == nil {
			return 1
		}
	}
	return 0
}

func localnetConfig(n int) (coordinator.Config, coordinator.Model) {
	batch := uint16(max(n, 8))
	cfg := coordinator.Config{
		WarmupTime: 10, CooldownTime: 5, MaxRoundTrainTime: 15, RoundWitnessTime: 2, EpochTime: 30,
		WaitingForMembersExtraTime: 2, TotalSteps: 10_000,
		GlobalBatchSizeStart: batch, GlobalBatchSizeEnd: 2 * batch, GlobalBatchSizeWarmupTokens: 64 * 1024,
		InitMinClients: uint16(n), MinClients: uint16(n),
	}
	m := coordinator.Model{
		Architecture: coordinator.ArchGPT, DataKind: coordinator.DataLocal, TokenSize: 2,
		MaxSeqLen: 128, VocabSize: 256, DModel: 64, NLayers: 2, NHeads: 4,
		LR: coordinator.LRSchedule{Kind: coordinator.LRConstant, BaseLR: 1e-3},
		Optimizer: coordinator.Optimizer{Kind: coordinator.OptimizerDistro, CompressionDecay: 0.999,
			CompressionTopK: 4, CompressionChunk: 64, Quantize1Bit: true},
	}
	m.Checkpoint.Kind = coordinator.CheckpointHub
	_ = coordinator.SetFixedString(m.Checkpoint.Source.URL[:], "file://checkpoints/localnet")
	_ = coordinator.SetFixedString(m.DataLocation[:], "data/opticks.tokens")
	return cfg, m
}
