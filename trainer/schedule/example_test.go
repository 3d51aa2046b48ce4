package schedule_test

import (
	"fmt"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/schedule"
)

// A cosine schedule with 4 warmup steps and an 8-step decay to a tenth of the
// peak rate. Steps are numbered from 1, like the coordinator's.
func ExampleLR() {
	s := coordinator.LRSchedule{
		Kind:        coordinator.LRCosine,
		BaseLR:      1e-3,
		FinalLR:     1e-4,
		WarmupSteps: 4,
		DecaySteps:  8,
	}
	for _, step := range []uint32{1, 2, 4, 6, 8, 10, 12, 100} {
		fmt.Printf("step %3d: %.4g\n", step, schedule.LR(s, step))
	}
	// Output:
	// step   1: 0.00025
	// step   2: 0.0005
	// step   4: 0.001
	// step   6: 0.0008682
	// step   8: 0.00055
	// step  10: 0.0002318
	// step  12: 0.0001
	// step 100: 0.0001
}
