package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/psyche-go/psyche/distro"
	"github.com/psyche-go/psyche/trainer/engine"
	"github.com/psyche-go/psyche/trainer/engine/torch"
	"github.com/psyche-go/psyche/trainer/modelspec"
)

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// mix is a 32-bit integer hash (lowbias32); bench_engine_ref.py has the
// same.
func mix(x uint32) uint32 {
	x ^= x >> 16
	x *= 0x7feb352d
	x ^= x >> 15
	x *= 0x846ca68b
	x ^= x >> 16
	return x
}

// makeBatch is round's batch: b sequences of t tokens, the stream's token
// i being mix(i ^ mix(round + 0x9e3779b9)) % vocab, sequence j reading
// tokens j(t+1) .. j(t+1)+t (inputs the first t, targets the last t).
func makeBatch(round, b, t, vocab int) engine.Batch {
	key := mix(uint32(round) + 0x9e3779b9)
	in, tg := make([]uint32, b*t), make([]uint32, b*t)
	for j := range b {
		for p := range t {
			i := uint32(j*(t+1) + p)
			in[j*t+p] = mix(i^key) % uint32(vocab)
			tg[j*t+p] = mix((i+1)^key) % uint32(vocab)
		}
	}
	return engine.Batch{Inputs: in, Targets: tg, Seqs: b, SeqLen: t}
}

// peerFrames makes n frames of other peers: in tile t of tensor i of peer
// p (1..n), K distinct indices start + j·(ts/K) mod ts (start = h mod ts,
// h = mix(mix(mix(p) ^ i) ^ t)), value +1 where mix(h ^ (j+1)·0x9e3779b9)
// is odd, else −1 (1-bit or not).
func peerFrames(plan *distro.Plan, n int) ([]*distro.Frame, error) {
	var out []*distro.Frame
	layouts := plan.Layouts()
	for p := 1; p <= n; p++ {
		idx, vals := make([][]uint32, len(layouts)), make([][]float32, len(layouts))
		for i, l := range layouts {
			ts, k := l.TileH*l.TileW, l.K
			step := ts / k
			tiles := l.Tiles()
			idx[i], vals[i] = make([]uint32, 0, tiles*k), make([]float32, 0, tiles*k)
			for t := range tiles {
				h := mix(mix(mix(uint32(p))^uint32(i)) ^ uint32(t))
				start := int(h % uint32(ts))
				for j := range k {
					idx[i] = append(idx[i], uint32((start+j*step)%ts))
					v := float32(-1)
					if mix(h^(uint32(j+1)*0x9e3779b9))&1 == 1 {
						v = 1
					}
					vals[i] = append(vals[i], v)
				}
			}
		}
		f, err := plan.FrameOf(idx, vals)
		if err != nil {
			return nil, fmt.Errorf("peer frame %d: %w", p, err)
		}
		out = append(out, f)
	}
	return out, nil
}

// modelConfig is the shape as the worker's models.build reads it: what
// the torch engine sends.
func modelConfig(c modelspec.Config) map[string]any {
	_, config := torch.ModelConfig(c)
	return config
}

// writeSpec writes what bench_engine_ref.py needs to repeat the work.
func writeSpec(s *settings, specPath, weightsPath string) error {
	m, err := newModel(s, nil)
	if err != nil {
		return err
	}
	shapes, config, params, flops := m.Shapes(), any(nil), m.NumParams(), 0.0
	if s.tf != nil {
		// transformers names and shapes the tensors (describe); the
		// reference builds the model from the same config.json text and
		// draws it from the same seed as the worker.
		shapes, params, flops = s.shapes, modelspec.NumParams(s.shapes), s.hf.flopsPerToken(s.seq)
		config = map[string]any{"json": string(s.tf.JSON), "seed": s.tf.Seed}
	} else {
		config, flops = modelConfig(s.cfg), flopsPerToken(s.cfg, s.seq)
	}
	plan, err := distro.NewPlan(shapes, s.opts)
	if err != nil {
		return err
	}
	if specPath != "" {
		var layouts []map[string]any
		for _, l := range plan.Layouts() {
			layouts = append(layouts, map[string]any{"shape": l.Shape, "outer": l.Outer, "rows": l.Rows, "cols": l.Cols,
				"th": l.TileH, "tw": l.TileW, "k": l.K})
		}
		o := s.opts
		spec := map[string]any{
			"shape": s.shape, "arch": modelspec.ArchName(s.cfg.Arch), "config": config, "shapes": shapes, "layouts": layouts,
			"params": params, "flops_per_token": flops,
			"distro": map[string]any{"decay": o.Decay, "weight_decay": o.WeightDecay, "clip": o.ClipGradNorm,
				"quantize": o.Quantize1Bit, "normalize_rms": o.NormalizeRMS, "max_value": distro.MaxValue},
			"aggregation": o.Aggregation.String(), "peers": s.peers, "lr": s.lr, "seq": s.seq, "vocab": vocab(s.cfg),
		}
		b, err := json.MarshalIndent(spec, "", " ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(specPath, b, 0o644); err != nil {
			return err
		}
	}
	if weightsPath != "" && s.tf == nil {
		f, err := os.Create(weightsPath)
		if err != nil {
			return err
		}
		w := bufio.NewWriterSize(f, 1<<20)
		var buf [4]byte
		for _, t := range m.Tensors() {
			for _, v := range t {
				binary.LittleEndian.PutUint32(buf[:], math.Float32bits(v))
				_, _ = w.Write(buf[:]) // its error comes back from Flush
			}
		}
		if err := w.Flush(); err != nil {
			_ = f.Close()
			return err
		}
		return f.Close()
	}
	return nil
}

// nvidiaSMIMemory is the device memory nvidia-smi says process pid holds,
// in bytes.
func nvidiaSMIMemory(pid int) (int64, error) {
	out, err := exec.Command("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits").Output()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, ",")
		if len(f) != 2 {
			continue
		}
		if p, err := strconv.Atoi(strings.TrimSpace(f[0])); err != nil || p != pid {
			continue
		}
		mib, err := strconv.ParseInt(strings.TrimSpace(f[1]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("used_memory %q", f[1])
		}
		return mib << 20, nil
	}
	return 0, fmt.Errorf("process %d is not among its compute apps (a container may hide pids)", pid)
}

// peakRSS is a process's peak resident memory (VmHWM), in bytes, on Linux.
func peakRSS(pid string) (int64, error) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, errors.New("no VmHWM")
}
