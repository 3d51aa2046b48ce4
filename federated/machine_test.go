package federated

import (
	"math"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
)

// A step that would leave a weight infinite is dropped, never stored: the
// model and round stay, and Ready says so.
func TestApplyNeverStoresANonFiniteModel(t *testing.T) {
	m, err := New(Config{Capacity: 1, RoundDuration: 1}, []float32{math.MaxFloat32, 1})
	if err != nil {
		t.Fatal(err)
	}
	m.apply([]float32{math.MaxFloat32, 1}, []coordinator.Pubkey{{1}})
	st, rd := m.State(), m.Ready()
	if st.Round != 0 || st.Model[0] != math.MaxFloat32 || st.Model[1] != 1 {
		t.Fatalf("round %d, model %v: the step was applied", st.Round, st.Model)
	}
	if len(rd.Aggregated) != 1 || !rd.Aggregated[0].Dropped || !rd.Persist {
		t.Fatalf("ready %+v: want one dropped aggregation, persisted", rd)
	}
	m.Advance()
	m.apply([]float32{-1, 1}, []coordinator.Pubkey{{1}})
	if st := m.State(); st.Round != 1 || st.Model[1] != 2 {
		t.Fatalf("a finite step: round %d, model %v", st.Round, st.Model)
	}
}
