package node_test

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/engine/torch"
	"github.com/psyche-go/psyche/trainer/node"
)

func torchOpener(t *testing.T) *torch.Opener {
	t.Helper()
	op, err := torch.New()
	if err != nil {
		t.Fatal(err)
	}
	return op
}

// engines gives trainer i the options of kinds[i]: go (the default), a
// torch opener of its own, or torch2: a torch opener over two CPU ranks.
func engines(t *testing.T, kinds ...string) (func(i int) []node.Option, []*torch.Opener) {
	ops := make([]*torch.Opener, len(kinds))
	for i, k := range kinds {
		switch k {
		case "torch":
			ops[i] = torchOpener(t)
		case "torch2":
			op, err := torch.New(torch.WithDevices([]string{"cpu", "cpu"}))
			if err != nil {
				t.Fatal(err)
			}
			ops[i] = op
		}
	}
	return func(i int) []node.Option {
		if ops[i] == nil {
			return nil
		}
		return []node.Option{node.WithEngine(ops[i])}
	}, ops
}

// TestTorchTrainersTrainTogether: three trainers on the PyTorch engine
// train two epochs together: identical weights, lower loss.
func TestTorchTrainersTrainTogether(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	opts, _ := engines(t, "torch", "torch", "torch")
	c := newCluster(t, 3, nil, opts, epochs(2))
	c.waitFor("two epochs", func(s *coordinator.Coordinator) bool {
		return s.Progress.Epoch >= 2 && s.RunState == coordinator.WaitingForMembers
	})
	c.stopAll(0, 1, 2)
	c.sameWeights(0, 1, 2)
	c.lossWentDown(0)
}

// TestMixedEnginesTrainTogether: a Go trainer and two torch trainers in one
// run. Both engines apply the aggregate that distro.Plan.Combine decided;
// the torch trainers hold identical weights, and the Go trainer's may
// differ only where an inverse-DCT output within rounding of zero took the
// other sign (measured: a few parameters in a million a round, often none).
func TestMixedEnginesTrainTogether(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	opts, _ := engines(t, "go", "torch", "torch")
	c := newCluster(t, 3, nil, opts, epochs(2))
	c.waitFor("two epochs", func(s *coordinator.Coordinator) bool {
		return s.Progress.Epoch >= 2 && s.RunState == coordinator.WaitingForMembers
	})
	c.stopAll(0, 1, 2)
	c.sameWeights(1, 2)
	goW, torchW := paramsOf(c.nodes[0].Model()), paramsOf(c.nodes[1].Model())
	differ := 0
	for i := range goW {
		if goW[i] != torchW[i] {
			differ++
		}
	}
	t.Logf("the Go trainer's weights differ from the torch trainers' in %d of %d parameters", differ, len(goW))
	if differ*100 > len(goW) {
		t.Errorf("the engines drifted apart: %d of %d parameters differ", differ, len(goW))
	}
	c.lossWentDown(0)
	c.lossWentDown(1)
}

// TestWorkerKilledMidRound: the worker of one trainer is killed while the
// run trains. That trainer's Run ends with an error that says what happened
// to its worker (the trainer exits non-zero; a restarted one joins again
// and loads the model from its peers), no worker process is left, and the
// other two drop it and train on.
func TestWorkerKilledMidRound(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	opts, ops := engines(t, "torch", "torch", "torch")
	c := newCluster(t, 3, nil, opts, oneEpoch)
	var pids []int
	c.waitFor("training", func(s *coordinator.Coordinator) bool {
		if s.RunState != coordinator.RoundTrain || s.Progress.Step < 3 {
			return false
		}
		pids = ops[2].Pids()
		return len(pids) == 1
	})
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := c.result(2)
	if err == nil || !strings.Contains(err.Error(), "worker failed") || !strings.Contains(err.Error(), "signal: killed") {
		t.Fatalf("trainer 2 after its worker was killed: %v, want the worker's death", err)
	}
	t.Logf("trainer 2: %v", err)
	c.stopped = map[int]bool{2: true}
	if left := ops[2].Pids(); len(left) != 0 {
		t.Fatalf("workers left behind: %v", left)
	}
	if err := syscall.Kill(pids[0], 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the killed worker %d is still there: %v", pids[0], err)
	}
	c.waitFor("the others train on without it", func(s *coordinator.Coordinator) bool {
		return s.Progress.Epoch >= 1 && s.RunState == coordinator.WaitingForMembers
	})
	c.stopAll(0, 1)
	c.sameWeights(0, 1)
}

// TestMultiDeviceTrainerTrains: a trainer whose worker runs over two ranks
// (gloo on the CPU: its batch split, its gradients summed) trains among a
// one-device torch trainer and a Go one. To the run it is one trainer: one
// frame a round; it ends with the one-device torch trainer's weights, bit
// for bit, and a lower loss.
func TestMultiDeviceTrainerTrains(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	opts, ops := engines(t, "torch2", "torch", "go")
	c := newCluster(t, 3, nil, opts, oneEpoch)
	ranks := 0
	c.waitFor("an epoch", func(s *coordinator.Coordinator) bool {
		ranks = max(ranks, len(ops[0].RankPids()))
		return s.Progress.Epoch >= 1 && s.RunState == coordinator.WaitingForMembers
	})
	c.stopAll(0, 1, 2)
	if ranks != 1 {
		t.Fatalf("trainer 0's worker ran %d further ranks, want 1", ranks)
	}
	c.sameWeights(0, 1)
	c.lossWentDown(0)
}
