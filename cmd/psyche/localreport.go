package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/explorer"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// saveInterrupted writes the first honest trainer's model, the run's
// weights when it was interrupted, beside the run's other files and says
// where.
func saveInterrupted(out io.Writer, dir, runID string, s *coordinator.Coordinator, trainers []*localTrainer) error {
	m := trainers[0].Node.Model()
	if m == nil {
		return nil
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-interrupted-step%d.safetensors", runID, s.Progress.Step))
	if err := m.Save(context.Background(), path, map[string]string{"run": runID, "step": fmt.Sprint(s.Progress.Step)}); err != nil {
		return fmt.Errorf("saving the weights at the interruption: %w", err)
	}
	fmt.Fprintf(out, "weights at the interruption: %s (newer than the checkpoint above)\n", path)
	return nil
}

// followLocalRun prints a progress line at each new step until the run has
// passed epochs epochs or finished, ctx ends (an interrupt), or a trainer
// fails. It returns the last state and the rounds' timing.
func followLocalRun(ctx, runCtx context.Context, out io.Writer, b chain.Backend, runID string, epochs int,
	trainers []*localTrainer, errs <-chan error, onStep func(*coordinator.Coordinator)) (*coordinator.Coordinator, *roundClock, error) {
	snaps, err := b.Subscribe(runCtx, runID)
	if err != nil {
		return nil, nil, err
	}
	start := time.Now()
	var last *coordinator.Coordinator
	lastStep := uint32(0)
	rounds := &roundClock{}
	dropped := map[coordinator.ClientID]bool{}
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "interrupted")
			return last, rounds, nil
		case err := <-errs:
			return nil, nil, fmt.Errorf("a trainer stopped: %w", err)
		case s, ok := <-snaps:
			if !ok {
				return last, rounds, nil
			}
			last = s.State
			reportDrops(out, s.State, trainers, dropped)
			if s.State.Progress.Step != lastStep && s.State.RunState == coordinator.RoundTrain {
				lastStep = s.State.Progress.Step
				rounds.start(s.State.Progress.Epoch, trainers)
				printLocalProgress(out, s.State, trainers, time.Since(start))
				onStep(s.State)
			}
			if int(s.State.Progress.Epoch) >= epochs || s.State.RunState == coordinator.Finished {
				return last, rounds, nil
			}
		}
	}
}

// reportDrops prints, once each, the trainers a health check dropped.
func reportDrops(out io.Writer, s *coordinator.Coordinator, trainers []*localTrainer, seen map[coordinator.ClientID]bool) {
	for _, c := range append(s.Epoch.Clients[:s.Epoch.ClientsLen:s.Epoch.ClientsLen], s.Epoch.Exited[:s.Epoch.ExitedLen]...) {
		if c.State != coordinator.Dropped || seen[c.ID] {
			continue
		}
		seen[c.ID] = true
		for i, t := range trainers {
			if t.Node.ID() == c.ID {
				fmt.Fprintf(out, "localnet: trainer %d was dropped by a health check (epoch %d, step %d)\n", i, s.Progress.Epoch, s.Progress.Step)
			}
		}
	}
}

// roundClock splits the rounds' wall time into the trainers' compute and the
// rest (coordination and networking), from the start of each round to the
// next one's within an epoch.
type roundClock struct {
	epoch   uint32
	at      time.Time
	compute time.Duration // all trainers' compute so far
	n       int
	wall    time.Duration // measured rounds' total
	busy    time.Duration // their compute, summed over trainers
}

func (r *roundClock) start(epoch uint32, trainers []*localTrainer) {
	now := time.Now()
	var compute time.Duration
	for _, t := range trainers {
		compute += t.progress().Compute
	}
	if !r.at.IsZero() && epoch == r.epoch {
		r.n++
		r.wall += now.Sub(r.at)
		r.busy += compute - r.compute
	}
	r.epoch, r.at, r.compute = epoch, now, compute
}

// report prints the mean round and its split; a trainer's share is its
// compute averaged over the trainers.
func (r *roundClock) report(w io.Writer, trainers int) {
	if r.n == 0 {
		return
	}
	round := r.wall / time.Duration(r.n)
	compute := r.busy / time.Duration(r.n*trainers)
	other := round - compute
	fmt.Fprintf(w, "rounds: %s mean over %d; training compute %s (%.0f%%), coordination + networking %s (%.0f%%)\n",
		round.Round(time.Millisecond), r.n, compute.Round(time.Millisecond), 100*float64(compute)/float64(round),
		other.Round(time.Millisecond), 100*float64(other)/float64(round))
}

func printLocalProgress(w io.Writer, s *coordinator.Coordinator, trainers []*localTrainer, elapsed time.Duration) {
	var loss float32
	var tokens, sent uint64
	count := 0
	for _, t := range trainers {
		p := t.progress()
		if p.Loss > 0 {
			loss += p.Loss
			count++
		}
		tokens += p.Tokens
		sent += p.Sent
	}
	shown := "    -" // no batch trained yet: no loss to show
	if count > 0 {
		shown = fmt.Sprintf("%.3f", loss/float32(count))
	}
	fmt.Fprintf(w, "%6.1fs  epoch %d  step %3d  clients %d  loss %s  tokens %7d (%.0f/s)  sent %s\n",
		elapsed.Seconds(), s.Progress.Epoch, s.Progress.Step, s.Epoch.ClientsLen, shown, tokens,
		float64(tokens)/elapsed.Seconds(), bytesString(sent))
}

func bytesString(b uint64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// heldOutLoss is the mean loss over up to 32 held-out sequences, taken 4 at
// a time: a model keeps activations and their gradients sized for its last
// batch, and with Llama 3's 128,256-token vocabulary 32 sequences' logits
// alone are a gigabyte, twice. A large model gets fewer (heldOutFLOPs), at
// least 4.
// heldOutFLOPs bounds the forward passes of one held-out loss (about
// 2 FLOPs a parameter a token), which run on this process's Go kernels
// before the run, after it and at every recorded checkpoint: the 32
// sequences of the small models localnet trains by default take seconds,
// while a 0.5B model's would take minutes each on a small machine.
const heldOutFLOPs = 1e12

func heldOutLoss(m runmodel.Model, tokens []uint32) (float32, error) {
	const chunk = 4
	cfg, err := runmodel.ConfigOf(m)
	if err != nil {
		return 0, err
	}
	forward := m.Forward
	if tf, ok := m.(*runmodel.Transformers); ok {
		// No Go implementation: a torch engine computes its losses.
		e, err := openTransformers(context.Background(), tf)
		if err != nil {
			return 0, err
		}
		defer e.Close()
		forward = func(in, tg []uint32, b, t int) (float32, error) {
			l, err := e.Losses(context.Background(), engine.Batch{Inputs: in, Targets: tg, Seqs: b, SeqLen: t})
			return l.Mean, err
		}
	}
	t := cfg.Context()
	seqs := min(32, (len(tokens)-1)/t, max(4, int(heldOutFLOPs/(2*float64(m.NumParams())*float64(t)))))
	if seqs < 1 {
		return 0, fmt.Errorf("the held-out tenth of the data has %d tokens, fewer than one sequence of %d needs", len(tokens), t+1)
	}
	in, tg := make([]uint32, chunk*t), make([]uint32, chunk*t)
	var sum float64
	for first := 0; first < seqs; first += chunk {
		n := min(chunk, seqs-first)
		for i := range n {
			at := (first + i) * t
			copy(in[i*t:], tokens[at:at+t])
			copy(tg[i*t:], tokens[at+1:at+t+1])
		}
		loss, err := forward(in[:n*t], tg[:n*t], n, t)
		if err != nil {
			return 0, err
		}
		sum += float64(loss) * float64(n)
	}
	return float32(sum / float64(seqs)), nil
}

func summarize(w io.Writer, s *coordinator.Coordinator, initial runmodel.Model, trainers []*localTrainer, heldOut []uint32, elapsed time.Duration) error {
	if s == nil {
		return fmt.Errorf("no coordinator state was received")
	}
	final := trainers[0].Node.Model()
	var tokens, sent, results uint64
	for _, t := range trainers {
		p := t.progress()
		tokens += p.Tokens
		sent += p.Sent
	}
	fmt.Fprintf(w, "\ndone in %s: epoch %d, step %d\n", elapsed.Round(time.Second), s.Progress.Epoch, s.Progress.Step)
	before, err := heldOutLoss(initial, heldOut)
	if err != nil {
		return err
	}
	if final != nil {
		after, err := heldOutLoss(final, heldOut)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "held-out loss: %.3f -> %.3f\n", before, after)
		held := make([]heldModel, len(trainers))
		for i, t := range trainers {
			held[i] = heldModel{engine: t.engine, model: t.Node.Model()}
		}
		reportWeights(w, held)
		if final.Hash() == initial.Hash() && tokens > 0 {
			fmt.Fprintf(w, "note: the trainers trained but no round's results were applied: when batches take longer than a round may last (%d s here), "+
				"the rounds end without them; on a slow or busy machine use --virtual-time (timeouts then never race compute) or a smaller --batch\n",
				s.Config.MaxRoundTrainTime)
		}
	}
	if s.Progress.Step > 0 {
		results = uint64(s.Progress.Step-1) * uint64(len(trainers))
	}
	dense := results * 4 * uint64(initial.NumParams())
	fmt.Fprintf(w, "tokens trained: %d\n", tokens)
	var verified uint64
	var verify, compute time.Duration
	for _, t := range trainers {
		p := t.progress()
		verified, verify, compute = verified+p.Verified, verify+p.Verify, compute+p.Compute
	}
	if verified > 0 {
		fmt.Fprintf(w, "verification: %d results scored, %s of the trainers' %s of compute (%.1f%%)\n", verified,
			verify.Round(time.Millisecond), compute.Round(time.Millisecond), 100*verify.Seconds()/compute.Seconds())
	}
	if sent > 0 && dense > 0 {
		fmt.Fprintf(w, "results sent: %s (dense fp32 gradients would be %s: %.0fx more)\n", bytesString(sent), bytesString(dense), float64(dense)/float64(sent))
	}
	url := coordinator.FixedString(s.Model.Checkpoint.Source.URL[:])
	note := ""
	if strings.HasPrefix(url, "seed:") {
		note = ", the run's start: no epoch has ended"
	}
	fmt.Fprintf(w, "checkpoint: %s (%s%s)\n", strings.TrimPrefix(url, "file://"), s.Model.Checkpoint.Kind, note)
	return nil
}

// engineDriftBound is the share of parameters in which two engines'
// weights may differ after a mixed run: each round, a parameter whose
// update is within rounding of zero before its sign may take the other
// sign on the other engine (docs/running.md, "Mixed runs"; measured: none
// to a few in a million a round).
const engineDriftBound = 0.01

// heldModel is the model a trainer of engine holds at the end (nil: none).
type heldModel struct {
	engine string
	model  runmodel.Model
}

// reportWeights prints, for each engine in the order the trainers use
// them, one line saying whether its trainers hold identical weights:
// trainers of one engine and device type apply every round bit for bit
// alike, so false there is a fault (the soak script counts these lines).
// With several engines, one more line says how far the engines' weights
// differ (engines may differ by rounding: engineDriftBound), so that a
// mixed run's summary does not read as a failure. A line's hash tells
// runs apart: a --virtual-time run with the same --seed ends at the same.
func reportWeights(w io.Writer, held []heldModel) {
	var engines []string
	by := map[string][]runmodel.Model{}
	for _, h := range held {
		if _, ok := by[h.engine]; !ok {
			engines = append(engines, h.engine)
		}
		by[h.engine] = append(by[h.engine], h.model)
	}
	for _, e := range engines {
		ms := by[e]
		what := fmt.Sprintf("%s: %d %s", e, len(ms), plural(len(ms), "trainer", "trainers"))
		switch first := ms[0]; {
		case slices.Contains(ms, nil):
			fmt.Fprintf(w, "trainers hold identical weights: false (%s; a trainer holds no model)\n", what)
		case slices.ContainsFunc(ms, func(m runmodel.Model) bool { return m.Hash() != first.Hash() }):
			var worst weightsDiff
			for _, m := range ms[1:] {
				worst = worst.max(diffWeights(first, m))
			}
			fmt.Fprintf(w, "trainers hold identical weights: false (%s; %s)\n", what, worst)
		default:
			fmt.Fprintf(w, "trainers hold identical weights: true (%s, hash %s)\n", what, runmodel.Revision(first))
		}
	}
	if len(engines) < 2 {
		return
	}
	base := by[engines[0]][0]
	if base == nil {
		return
	}
	var worst weightsDiff
	for _, e := range engines[1:] {
		if m := by[e][0]; m != nil {
			worst = worst.max(diffWeights(base, m))
		}
	}
	verdict := ""
	switch {
	case worst.differ == 0:
	case float64(worst.differ) > engineDriftBound*float64(worst.of):
		verdict = fmt.Sprintf(": beyond the bound of %g%% of parameters that rounding allows (docs/running.md, \"Mixed runs\"), the engines drifted apart", 100*engineDriftBound)
	default:
		verdict = fmt.Sprintf(": within the bound of %g%% of parameters that rounding allows (docs/running.md, \"Mixed runs\")", 100*engineDriftBound)
	}
	fmt.Fprintf(w, "engines %s: %s%s\n", strings.Join(engines, " and "), worst, verdict)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// weightsDiff is how far two models' weights are apart.
type weightsDiff struct {
	differ, of int     // parameters that differ, of all
	largest    float64 // the largest absolute difference
}

// max is the farther apart of d and o (o, when d compared nothing).
func (d weightsDiff) max(o weightsDiff) weightsDiff {
	if d.of == 0 || o.differ > d.differ || (o.differ == d.differ && o.largest > d.largest) {
		return o
	}
	return d
}

func (d weightsDiff) String() string {
	if d.differ == 0 {
		return fmt.Sprintf("identical weights (%d parameters)", d.of)
	}
	return fmt.Sprintf("%d of %d parameters differ (%.4f%%), the largest by %.3g", d.differ, d.of, 100*float64(d.differ)/float64(d.of), d.largest)
}

// diffWeights compares two models of one shape parameter by parameter.
func diffWeights(a, b runmodel.Model) weightsDiff {
	var d weightsDiff
	ta, tb := a.Tensors(), b.Tensors()
	for i := range min(len(ta), len(tb)) {
		for j := range min(len(ta[i]), len(tb[i])) {
			d.of++
			if x, y := ta[i][j], tb[i][j]; x != y {
				d.differ++
				d.largest = max(d.largest, math.Abs(float64(x)-float64(y)))
			}
		}
	}
	return d
}

// dropLast runs the last trainer until the run reaches step at (0: to the
// end), then stops it as a machine that fails would stop: its node and its
// libp2p host end, and the others' witnesses report it missing. Its result
// goes to errs only once runCtx ends, so the run goes on without it. The
// returned function is called at each new step.
func dropLast(runCtx context.Context, out io.Writer, t *localTrainer, at int, errs chan<- error) func(*coordinator.Coordinator) {
	ctx, stop := context.WithCancel(runCtx)
	go func() {
		err := t.Node.Run(ctx)
		if ctx.Err() != nil && runCtx.Err() == nil {
			<-runCtx.Done() // stopped on purpose: not a failure of the run
			err = nil
		}
		errs <- err // as for every other trainer, if it stopped by itself
	}()
	var once sync.Once
	return func(s *coordinator.Coordinator) {
		if at <= 0 || s.Progress.Step < uint32(at) {
			return
		}
		once.Do(func() {
			fmt.Fprintf(out, "localnet: stopping trainer %s at step %d (--drop-trainer-at)\n", t.Node.ID().Signer.String(), s.Progress.Step)
			stop()
			t.Close() // leaves the network
		})
	}
}

// startLocalExplorer serves the run explorer for the run on addr (none if
// addr is empty) until ctx ends, and prints its address. It measures the
// held-out loss of the initial model and of every checkpoint the run
// records (they are files here) for the loss curve.
func startLocalExplorer(ctx context.Context, addr string, out io.Writer, log *slog.Logger, lb *localBackend, runID string, epochs int, files localFiles) error {
	if addr == "" {
		return nil
	}
	opts := []explorer.Option{explorer.WithLogger(log), explorer.WithRefresh(time.Second), explorer.WithEpochLimit(uint32(epochs))}
	if lb.clock != nil {
		opts = append(opts, explorer.WithClock(lb.clock.Now))
	}
	ex, err := explorer.New(opts...)
	if err != nil {
		return err
	}
	src := explorer.FixedRuns(lb.backend, runID)
	if lb.server != nil {
		src = serverSource(lb.server)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--explorer-addr: %w", err)
	}
	if before, err := heldOutLoss(files.Initial, files.heldOut); err == nil {
		ex.RecordHeldOut(runID, 0, 0, float64(before))
	}
	snaps, err := lb.backend.Subscribe(ctx, runID)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "localnet: explorer http://%s/#/run/%s\n", l.Addr(), runID)
	go func() { _ = serveExplorer(ctx, l, ex, src, log) }()
	go measureCheckpoints(snaps, ex, runID, files.heldOut, log)
	return nil
}

// measureCheckpoints records the held-out loss of each checkpoint the run
// records (a file:// URL in a cooldown), at the step it was recorded.
func measureCheckpoints(snaps <-chan chain.Snapshot, ex *explorer.Explorer, runID string, heldOut []uint32, log *slog.Logger) {
	last := ""
	for s := range snaps {
		url := coordinator.FixedString(s.State.Model.Checkpoint.Source.URL[:])
		path, ok := strings.CutPrefix(url, "file://")
		if !s.State.Epoch.Checkpointed || !ok || url == last {
			continue
		}
		last = url
		m, err := runmodel.Load(context.Background(), path, nil)
		if err == nil {
			var loss float32
			if loss, err = heldOutLoss(m, heldOut); err == nil {
				ex.RecordHeldOut(runID, s.State.Progress.Step, s.State.Progress.Epoch, float64(loss))
				continue
			}
		}
		log.Warn("measuring a checkpoint's held-out loss", "checkpoint", url, "err", err)
	}
}
