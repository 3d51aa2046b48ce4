package drive_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/p2p"
	"github.com/psyche-go/psyche/trainer/node/drive"
	"github.com/psyche-go/psyche/trainer/node/machine"
)

// recorder is Effects that writes down each call; steps says what the
// pausing effects answer, in call order (Done once they run out).
type recorder struct {
	calls []string
	steps map[string][]drive.Step
	fail  string // the effect that returns an error
}

var errEffect = errors.New("effect failed")

func (r *recorder) step(name string) (drive.Step, error) {
	r.calls = append(r.calls, name)
	if name == r.fail {
		return drive.Done, errEffect
	}
	if q := r.steps[name]; len(q) > 0 {
		r.steps[name] = q[1:]
		return q[0], nil
	}
	return drive.Done, nil
}

func (r *recorder) note(format string, args ...any) {
	r.calls = append(r.calls, fmt.Sprintf(format, args...))
}

func (r *recorder) Apply(w *machine.ApplyWork) (drive.Step, error) {
	return r.step(fmt.Sprintf("apply %d", w.Step))
}
func (r *recorder) Load(w *machine.LoadWork) (drive.Step, error) {
	return r.step(fmt.Sprintf("load %d", w.Epoch))
}
func (r *recorder) TrainAhead(w machine.TrainWork) (drive.Step, error) {
	return r.step(fmt.Sprintf("ahead %d", w.Step))
}
func (r *recorder) Train(w *machine.TrainWork) (drive.Step, error) {
	return r.step(fmt.Sprintf("train %d", w.Step))
}
func (r *recorder) Trained(w *machine.TrainWork) (p2p.Announcement, *distro.Frame, machine.TrainStats, error) {
	_, err := r.step(fmt.Sprintf("trained %d", w.Step))
	return p2p.Announcement{Step: w.Step, Batch: w.Batch}, nil, machine.TrainStats{}, err
}
func (r *recorder) ReferenceLosses(w *machine.TrainWork) (map[uint64]float32, error) {
	_, err := r.step(fmt.Sprintf("reference %d", w.Step))
	return nil, err
}
func (r *recorder) Verify(w machine.VerifyWork) (float32, float32, bool, error) {
	_, err := r.step(fmt.Sprintf("verify %d", w.Step))
	return 0, 0, false, err
}
func (r *recorder) Send(ixs []coordinator.Instruction) { r.note("send %d", len(ixs)) }
func (r *recorder) DropFetches()                       { r.note("drop fetches") }
func (r *recorder) Fetch(anns []p2p.Announcement)      { r.note("fetch %d", len(anns)) }
func (r *recorder) Report(peers []coordinator.Pubkey)  { r.note("report %d", len(peers)) }
func (r *recorder) Checked(rs []machine.ReportChecked) { r.note("checked %d", len(rs)) }
func (r *recorder) Refused(rs []machine.RefusedResult) { r.note("refused %d", len(rs)) }
func (r *recorder) Pull(step uint32)                   { r.note("pull %d", step) }
func (r *recorder) Share(epoch uint32)                 { r.note("share %d", epoch) }
func (r *recorder) Save(w machine.SaveWork)            { r.note("save %d", w.Epoch) }
func (r *recorder) Tick()                              { r.note("tick") }

func u32(v uint32) *uint32 { return &v }

// every is a Ready with every field set.
func every() machine.Ready {
	return machine.Ready{
		Apply:       &machine.ApplyWork{Step: 3},
		Load:        &machine.LoadWork{Epoch: 1},
		Train:       &machine.TrainWork{Step: 5, Reference: []p2p.BatchRange{{Start: 0, End: 1}}},
		Send:        []coordinator.Instruction{&coordinator.Tick{}},
		Fetch:       []p2p.Announcement{{Step: 4}},
		Pull:        u32(4),
		Share:       u32(2),
		Save:        &machine.SaveWork{Epoch: 1},
		Tick:        true,
		Report:      []coordinator.Pubkey{{1}},
		Refused:     []machine.RefusedResult{{Step: 4}},
		Verify:      []machine.VerifyWork{{Step: 4}},
		Reports:     []machine.ReportChecked{{Step: 4}},
		DropFetches: true,
	}
}

func newDriver(r *recorder) *drive.Driver {
	m := machine.New(coordinator.ClientID{}, 0, false, func() uint64 { return 7 })
	return drive.New(m, r)
}

func TestDriver(t *testing.T) {
	fieldOrder := []string{"apply 3", "load 1", "train 5", "trained 5", "reference 5", "verify 4", "send 1", "drop fetches",
		"fetch 1", "report 1", "checked 1", "refused 1", "pull 4", "share 2", "save 1", "tick",
		// The Readies the machine answered the load, the training, the
		// reference losses and the verified work with, queued after it
		// (empty here: nothing else is going on).
		"fetch 0", "fetch 0", "fetch 0", "fetch 0"}
	tests := []struct {
		name   string
		steps  map[string][]drive.Step
		fail   string
		events []machine.Ready // posted in order
		// announceLast: the last event is an announcement instead.
		announceLast bool
		// resumes is how many times the driver is resumed after pausing.
		resumes int
		want    []string
		wantErr error
		done    string
	}{
		{name: "every field, in order", events: []machine.Ready{every()}, want: fieldOrder},
		{name: "nothing to do still offers the fetch queue its slots", events: []machine.Ready{{}}, want: []string{"fetch 0"}},
		{name: "again asks for the same effect after the pause", steps: map[string][]drive.Step{"apply 3": {drive.Again}},
			events: []machine.Ready{every()}, resumes: 1, want: append([]string{"apply 3"}, fieldOrder...)},
		{name: "later goes on after the effect", steps: map[string][]drive.Step{"train 5": {drive.Later}, "load 1": {drive.Later}},
			events: []machine.Ready{every()}, resumes: 2, want: fieldOrder},
		{name: "ahead skips the published result", events: []machine.Ready{{Train: &machine.TrainWork{Step: 6, Ahead: true}}},
			want: []string{"ahead 6", "fetch 0"}},
		{name: "an announcement goes before the events posted before it",
			events: []machine.Ready{{Pull: u32(1)}, {Pull: u32(2)}, {Pull: u32(9)}}, announceLast: true,
			want: []string{"fetch 0", "pull 9", "fetch 0", "pull 1", "fetch 0", "pull 2"}},
		{name: "done stops before the next event", events: []machine.Ready{{Done: "run finished", Tick: true}, {Pull: u32(1)}, {Pull: u32(2)}},
			want: []string{"fetch 0", "tick"}, done: "run finished"},
		{name: "an error stops the work", fail: "trained 5", events: []machine.Ready{every()},
			want: []string{"apply 3", "load 1", "train 5", "trained 5"}, wantErr: errEffect},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recorder{steps: tt.steps, fail: tt.fail}
			d := newDriver(r)
			for i, rd := range tt.events {
				rd := rd
				if tt.announceLast && i == len(tt.events)-1 {
					d.Announce(func() machine.Ready { return rd })
				} else {
					d.Post(func() machine.Ready { return rd })
				}
			}
			err := d.Pump()
			for i := 0; i < tt.resumes && err == nil; i++ {
				if !d.Paused() {
					t.Fatalf("resume %d: the driver is not paused; calls %q", i, r.calls)
				}
				err = d.Resume()
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err %v, want %v", err, tt.wantErr)
			}
			if d.Paused() {
				t.Errorf("still paused after %d resumes", tt.resumes)
			}
			if !slices.Equal(r.calls, tt.want) {
				t.Errorf("calls\n got %q\nwant %q", r.calls, tt.want)
			}
			if d.Done() != tt.done {
				t.Errorf("done %q, want %q", d.Done(), tt.done)
			}
		})
	}
}

// TestDoRefusesAPause: Do is for effects that finish before they return; a
// pause under it is an error, not work silently left half done.
func TestDoRefusesAPause(t *testing.T) {
	r := &recorder{steps: map[string][]drive.Step{"apply 3": {drive.Later}}}
	if err := newDriver(r).Do(every()); !errors.Is(err, drive.ErrPaused) {
		t.Fatalf("err %v, want ErrPaused", err)
	}
}
