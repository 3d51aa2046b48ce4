package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/federated"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/psyche-go/psyche/trainer/modelspec"
	"github.com/psyche-go/psyche/trainer/runmodel"
)

// runFile is the TOML form of a run's metadata, config and model (see
// examples/*.toml, which document every field).
type runFile struct {
	Metadata *struct {
		Name          string `toml:"name"`
		Description   string `toml:"description"`
		NumParameters uint64 `toml:"num_parameters"`
		VocabSize     uint64 `toml:"vocab_size"`
	} `toml:"metadata"`
	Config *struct {
		WarmupTime                  uint64 `toml:"warmup_time"`
		CooldownTime                uint64 `toml:"cooldown_time"`
		MaxRoundTrainTime           uint64 `toml:"max_round_train_time"`
		RoundWitnessTime            uint64 `toml:"round_witness_time"`
		EpochTime                   uint64 `toml:"epoch_time"`
		WaitingForMembersExtraTime  uint64 `toml:"waiting_for_members_extra_time"`
		GlobalBatchSizeStart        uint64 `toml:"global_batch_size_start"`
		GlobalBatchSizeEnd          uint64 `toml:"global_batch_size_end"`
		GlobalBatchSizeWarmupTokens uint64 `toml:"global_batch_size_warmup_tokens"`
		TotalSteps                  uint64 `toml:"total_steps"`
		InitMinClients              uint64 `toml:"init_min_clients"`
		MinClients                  uint64 `toml:"min_clients"`
		WitnessNodes                uint64 `toml:"witness_nodes"`
		VerificationPercent         uint64 `toml:"verification_percent"`
	} `toml:"config"`
	Model *struct {
		Architecture string `toml:"architecture"`
		// Transformers only: the config.json of the Hugging Face model.
		HFConfig  string `toml:"hf_config"`
		MaxSeqLen uint64 `toml:"max_seq_len"`
		VocabSize uint64 `toml:"vocab_size"`
		DModel    uint64 `toml:"d_model"`
		NLayers   uint64 `toml:"n_layers"`
		NHeads    uint64 `toml:"n_heads"`
		// Llama only.
		NKVHeads         uint64  `toml:"n_kv_heads"`
		IntermediateSize uint64  `toml:"intermediate_size"`
		RopeTheta        float64 `toml:"rope_theta"`
		TiedHead         bool    `toml:"tied_head"`
		TokenSize        uint64  `toml:"token_size"`
		Data             string  `toml:"data"`
		Checkpoint       struct {
			Kind     string `toml:"kind"`
			URL      string `toml:"url"`
			Revision string `toml:"revision"`
			Store    string `toml:"store"`
			Endpoint string `toml:"endpoint"`
			Region   string `toml:"region"`
		} `toml:"checkpoint"`
		LR struct {
			Schedule    string  `toml:"schedule"`
			Base        float64 `toml:"base"`
			Final       float64 `toml:"final"`
			WarmupSteps uint64  `toml:"warmup_steps"`
			DecaySteps  uint64  `toml:"decay_steps"`
			TotalSteps  uint64  `toml:"total_steps"`
		} `toml:"lr"`
		Optimizer struct {
			Kind             string  `toml:"kind"`
			ClipGradNorm     float64 `toml:"clip_grad_norm"`
			WeightDecay      float64 `toml:"weight_decay"`
			CompressionDecay float64 `toml:"compression_decay"`
			CompressionTopK  uint64  `toml:"compression_topk"`
			CompressionChunk uint64  `toml:"compression_chunk"`
			Quantize1Bit     bool    `toml:"quantize_1bit"`
			Aggregation      string  `toml:"aggregation"`
			Normalize        string  `toml:"normalize"`
			Beta1            float64 `toml:"beta1"`
			Beta2            float64 `toml:"beta2"`
			Epsilon          float64 `toml:"epsilon"`
		} `toml:"optimizer"`
	} `toml:"model"`
	// Federated is read by loadFederated (federated.go); it is named here
	// so that its keys are not unknown.
	Federated *federatedSection `toml:"federated"`
}

// updateWarning is what update warns of for a run file (empty: nothing):
// rounds so short of witnesses that one lying witness decides
// (witnessWarning). A federated run (a [federated] section) has no
// witnesses to warn of: its server aggregates the clients' updates, and
// its [config]'s clients and timers drive no rounds.
func updateWarning(u *coordinator.Update, fed *federated.Config) string {
	if u.Config == nil || fed != nil {
		return ""
	}
	return witnessWarning(u.Config)
}

// witnessWarning says what update warns of when a run's rounds can have so
// few witnesses that one lying witness decides (empty: they cannot). A
// trainer stays when a quorum of the round's witnesses counts it
// (coordinator.Quorum: 2 of 2, 1 of 1), so with fewer than 3 witnesses one
// witness that leaves an honest trainer out of its report drops it, and
// nothing else tells the run's creator. A round has min(witness_nodes, its
// clients) witnesses (32 for witness_nodes = 0), so the fewest are those of
// a round of min_clients.
func witnessWarning(k *coordinator.Config) string {
	w := k.WitnessCount(k.MinClients)
	q := coordinator.Quorum(w)
	if w > q {
		return ""
	}
	plural := func(n uint16, one, many string) string {
		if n == 1 {
			return fmt.Sprintf("%d %s", n, one)
		}
		return fmt.Sprintf("%d %s", n, many)
	}
	var why, fix string
	if k.WitnessNodes != 0 && k.WitnessNodes <= k.MinClients {
		why = fmt.Sprintf("witness_nodes = %d gives every round %s", k.WitnessNodes, plural(w, "witness", "witnesses"))
		fix = "set witness_nodes to at least 3 (or 0: one per client, up to 32), with min_clients at least that"
	} else {
		why = fmt.Sprintf("min_clients = %d lets a round run with %s and so %s", k.MinClients, plural(k.MinClients, "client", "clients"), plural(w, "witness", "witnesses"))
		fix = "raise min_clients to at least 3"
	}
	also := ""
	if w == 1 {
		also = ", and vouch alone for a dishonest one"
	}
	return fmt.Sprintf("%s: a trainer stays only if %d of %d count it, so one lying witness can drop an honest trainer%s; %s",
		why, q, w, also, fix)
}

// aggregationNames are the run file's names of the aggregation rules.
var aggregationNames = map[string]uint8{"robust": uint8(coordinator.AggregationRobust),
	"mean": uint8(coordinator.AggregationMean), "clipped-mean": uint8(coordinator.AggregationClippedMean)}

// normalizationNames are the run file's names of DisTrO's gradient
// normalizations.
var normalizationNames = map[string]uint8{"rms": uint8(coordinator.NormalizationRMS), "none": uint8(coordinator.NormalizationNone)}

// loadRunFile reads a run file into an update instruction (sections that are
// absent are left out of the update). Unknown keys and values that do not fit
// their fields are errors; the coordinator's own rules are checked too, and
// every violation is reported.
func loadRunFile(path string) (*coordinator.Update, error) {
	if err := refuseNegative(path); err != nil {
		return nil, err
	}
	var f runFile
	md, err := toml.DecodeFile(path, &f)
	if err != nil {
		return nil, tomlError(path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		sort.Strings(keys)
		return nil, fmt.Errorf("%s: unknown keys: %s", path, strings.Join(keys, ", "))
	}
	var errs []error
	fit := func(name string, v, max uint64) {
		if v > max {
			errs = append(errs, fmt.Errorf("%s = %d does not fit (maximum %d)", name, v, max))
		}
	}
	text := func(name string, dst []byte, s string) {
		if err := coordinator.SetFixedString(dst, s); err != nil {
			errs = append(errs, fmt.Errorf("%s: %d bytes, at most %d", name, len(s), len(dst)))
		}
	}
	u := &coordinator.Update{}
	if m := f.Metadata; m != nil {
		u.Metadata = &coordinator.Metadata{NumParameters: m.NumParameters, VocabSize: m.VocabSize}
		text("metadata.name", u.Metadata.Name[:], m.Name)
		text("metadata.description", u.Metadata.Description[:], m.Description)
	}
	if c := f.Config; c != nil {
		fit("config.global_batch_size_start", c.GlobalBatchSizeStart, math.MaxUint16)
		fit("config.global_batch_size_end", c.GlobalBatchSizeEnd, math.MaxUint16)
		fit("config.total_steps", c.TotalSteps, math.MaxUint32)
		fit("config.init_min_clients", c.InitMinClients, math.MaxUint16)
		fit("config.min_clients", c.MinClients, math.MaxUint16)
		fit("config.witness_nodes", c.WitnessNodes, math.MaxUint16)
		fit("config.verification_percent", c.VerificationPercent, 100)
		u.Config = &coordinator.Config{WarmupTime: c.WarmupTime, CooldownTime: c.CooldownTime,
			MaxRoundTrainTime: c.MaxRoundTrainTime, RoundWitnessTime: c.RoundWitnessTime, EpochTime: c.EpochTime,
			WaitingForMembersExtraTime: c.WaitingForMembersExtraTime, GlobalBatchSizeWarmupTokens: c.GlobalBatchSizeWarmupTokens,
			TotalSteps: uint32(c.TotalSteps), GlobalBatchSizeStart: uint16(c.GlobalBatchSizeStart),
			GlobalBatchSizeEnd: uint16(c.GlobalBatchSizeEnd), InitMinClients: uint16(c.InitMinClients),
			MinClients: uint16(c.MinClients), WitnessNodes: uint16(c.WitnessNodes), VerificationPercent: uint8(c.VerificationPercent)}
	}
	if m := f.Model; m != nil {
		for name, v := range map[string]uint64{"model.max_seq_len": m.MaxSeqLen, "model.vocab_size": m.VocabSize,
			"model.d_model": m.DModel, "model.n_layers": m.NLayers, "model.n_heads": m.NHeads,
			"model.n_kv_heads": m.NKVHeads, "model.intermediate_size": m.IntermediateSize,
			"model.lr.warmup_steps": m.LR.WarmupSteps, "model.lr.decay_steps": m.LR.DecaySteps, "model.lr.total_steps": m.LR.TotalSteps} {
			fit(name, v, math.MaxUint32)
		}
		fit("model.token_size", m.TokenSize, 255)
		fit("model.optimizer.compression_topk", m.Optimizer.CompressionTopK, math.MaxUint16)
		fit("model.optimizer.compression_chunk", m.Optimizer.CompressionChunk, math.MaxUint16)
		cm := &coordinator.Model{MaxSeqLen: uint32(m.MaxSeqLen), VocabSize: uint32(m.VocabSize), DModel: uint32(m.DModel),
			NLayers: uint32(m.NLayers), NHeads: uint32(m.NHeads), TokenSize: uint8(m.TokenSize),
			NKVHeads: uint32(m.NKVHeads), IntermediateSize: uint32(m.IntermediateSize), RopeTheta: float32(m.RopeTheta), TiedHead: m.TiedHead}
		choose := func(name, value string, options map[string]uint8, dst *uint8) {
			if v, ok := options[value]; ok {
				*dst = v
				return
			}
			var names []string
			for k := range options {
				names = append(names, k)
			}
			sort.Strings(names)
			errs = append(errs, fmt.Errorf("%s = %q: want one of %s", name, value, strings.Join(names, ", ")))
		}
		archs := map[string]uint8{}
		for a := coordinator.ArchGPT; a <= coordinator.ArchTransformers; a++ {
			archs[modelspec.ArchName(a)] = uint8(a)
		}
		choose("model.architecture", m.Architecture, archs, (*uint8)(&cm.Architecture))
		choose("model.checkpoint.kind", m.Checkpoint.Kind, map[string]uint8{"hub": uint8(coordinator.CheckpointHub),
			"p2p": uint8(coordinator.CheckpointP2P), "ephemeral": uint8(coordinator.CheckpointEphemeral)}, (*uint8)(&cm.Checkpoint.Kind))
		choose("model.lr.schedule", m.LR.Schedule, map[string]uint8{"constant": uint8(coordinator.LRConstant),
			"linear": uint8(coordinator.LRLinear), "cosine": uint8(coordinator.LRCosine), "wsd": uint8(coordinator.LRWarmupStableDecay)}, (*uint8)(&cm.LR.Kind))
		choose("model.optimizer.kind", m.Optimizer.Kind, map[string]uint8{"adamw": uint8(coordinator.OptimizerAdamW),
			"distro": uint8(coordinator.OptimizerDistro)}, (*uint8)(&cm.Optimizer.Kind))
		// Left out, the aggregation is the zero value: the robust rule.
		if m.Optimizer.Aggregation != "" {
			choose("model.optimizer.aggregation", m.Optimizer.Aggregation, aggregationNames, (*uint8)(&cm.Optimizer.Aggregation))
		}
		// Left out, the normalization is the zero value: rms.
		if m.Optimizer.Normalize != "" {
			choose("model.optimizer.normalize", m.Optimizer.Normalize, normalizationNames, (*uint8)(&cm.Optimizer.Normalization))
		}
		text("model.checkpoint.url", cm.Checkpoint.Source.URL[:], m.Checkpoint.URL)
		text("model.checkpoint.revision", cm.Checkpoint.Source.Revision[:], m.Checkpoint.Revision)
		text("model.checkpoint.store", cm.Store.URL[:], m.Checkpoint.Store)
		text("model.checkpoint.endpoint", cm.Store.Endpoint[:], m.Checkpoint.Endpoint)
		text("model.checkpoint.region", cm.Store.Region[:], m.Checkpoint.Region)
		text("model.data", cm.DataLocation[:], m.Data)
		// The coordinator stores these as text; what trainers can load is
		// checked here, so a typo fails the update instead of every trainer.
		if m.Checkpoint.URL != "" {
			if _, err := modelspec.ParseSource(m.Checkpoint.URL); err != nil {
				errs = append(errs, fmt.Errorf("model.checkpoint.url: %w", err))
			}
		}
		if m.Data != "" {
			if err := data.CheckLocation(m.Data); err != nil {
				errs = append(errs, fmt.Errorf("model.data = %q: %w", m.Data, err))
			}
		}
		if cm.Architecture == coordinator.ArchTransformers || m.HFConfig != "" {
			errs = append(errs, transformersModel(cm, m.HFConfig, m.DModel, m.NLayers, m.NHeads)...)
		}
		cm.DataKind = dataKind(m.Data)
		cm.LR.BaseLR, cm.LR.FinalLR = float32(m.LR.Base), float32(m.LR.Final)
		cm.LR.WarmupSteps, cm.LR.DecaySteps, cm.LR.TotalSteps = uint32(m.LR.WarmupSteps), uint32(m.LR.DecaySteps), uint32(m.LR.TotalSteps)
		o := &cm.Optimizer
		o.ClipGradNorm, o.WeightDecay, o.CompressionDecay = float32(m.Optimizer.ClipGradNorm), float32(m.Optimizer.WeightDecay), float32(m.Optimizer.CompressionDecay)
		o.CompressionTopK, o.CompressionChunk, o.Quantize1Bit = uint16(m.Optimizer.CompressionTopK), uint16(m.Optimizer.CompressionChunk), m.Optimizer.Quantize1Bit
		o.Beta1, o.Beta2, o.Epsilon = float32(m.Optimizer.Beta1), float32(m.Optimizer.Beta2), float32(m.Optimizer.Epsilon)
		u.Model = cm
	}
	if len(errs) == 0 {
		if u.Config != nil {
			errs = append(errs, u.Config.Validate())
		}
		if u.Model != nil {
			errs = append(errs, u.Model.Validate())
		}
	}
	if err := oneLine(path, errs); err != nil {
		return nil, err
	}
	return u, nil
}

// transformersModel completes a Transformers run's model from its
// hf_config, or from the checkpoint directory its url names: the shape
// fields mirror the config.json (a run file that sets them is refused: the
// file decides). With url = "seed:N" the source becomes seed:N@PATH and the
// revision the config's hash; with url = "file://DIR" (a Hugging Face
// directory: config.json and model.safetensors) the config is DIR's (an
// hf_config must be the same file) and the revision the hash of the config
// and the weights (runmodel.Revision), read here. Either way a revision in
// the file must be that hash. Paths are read here and, as written, by
// every trainer: relative, they are relative to each one's working
// directory.
func transformersModel(cm *coordinator.Model, path string, dModel, nLayers, nHeads uint64) []error {
	if cm.Architecture != coordinator.ArchTransformers {
		return []error{fmt.Errorf("model.hf_config is for architecture = \"transformers\"")}
	}
	url := coordinator.FixedString(cm.Checkpoint.Source.URL[:])
	src, srcErr := modelspec.ParseSource(url)
	fromDir := srcErr == nil && src.Kind == modelspec.FromFile
	var errs []error
	if dModel != 0 || nLayers != 0 || nHeads != 0 || cm.NKVHeads != 0 || cm.IntermediateSize != 0 || cm.RopeTheta != 0 || cm.TiedHead {
		errs = append(errs, fmt.Errorf("model.d_model, n_layers, n_heads, n_kv_heads, intermediate_size, rope_theta and tied_head come from the model's config.json: leave them out"))
	}
	key := "model.hf_config"
	if fromDir {
		dirConfig := filepath.Join(src.Path, "config.json")
		if path != "" {
			a, errA := os.ReadFile(path)
			b, errB := os.ReadFile(dirConfig)
			if errA == nil && errB == nil && !bytes.Equal(a, b) {
				return append(errs, fmt.Errorf("model.hf_config %s is not %s, the config of the checkpoint directory model.checkpoint.url names: leave hf_config out (the directory's config.json is the model's)", path, dirConfig))
			}
		}
		path, key = dirConfig, "model.checkpoint.url"
	}
	if path == "" {
		return append(errs, fmt.Errorf("model.hf_config: architecture = \"transformers\" needs the model's config.json (hf_config, with url = \"seed:N\"), or a checkpoint directory (url = \"file:///DIR\")"))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		if fromDir {
			return append(errs, fmt.Errorf("%s = %q: a transformers run's checkpoint directory holds config.json and model.safetensors (what save_pretrained writes): %w", key, url, err))
		}
		return append(errs, fmt.Errorf("%s: %w", key, err))
	}
	f, err := modelspec.ParseTransformersFile(data)
	if err != nil {
		// One violation each, so that the run file's error stays one line.
		parts := []error{err}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			parts = j.Unwrap()
		}
		for _, p := range parts {
			errs = append(errs, fmt.Errorf("%s %s: %w", key, path, p))
		}
		return errs
	}
	c, err := f.Mirror(int(cm.MaxSeqLen))
	if err != nil {
		return append(errs, fmt.Errorf("%s %s: %w", key, path, err))
	}
	if cm.VocabSize != 0 && int(cm.VocabSize) != c.Vocab {
		errs = append(errs, fmt.Errorf("model.vocab_size = %d, but %s has vocab_size %d", cm.VocabSize, path, c.Vocab))
	}
	modelspec.SetTransformers(cm, c)
	var hash, what string
	switch {
	case fromDir:
		if len(errs) > 0 {
			return errs
		}
		// The run's revision names the weights as well as the config:
		// every trainer checks the directory it reads against it.
		t, err := runmodel.LoadRunTransformers(cm)
		if err != nil {
			return append(errs, fmt.Errorf("%s = %q: %w", key, url, err))
		}
		hash, what = runmodel.Revision(t), "the model in "+src.Path
	case srcErr != nil || src.Kind != modelspec.FromSeed || src.Config != "":
		return append(errs, fmt.Errorf("model.checkpoint.url = %q: a transformers run starts from seed:N (its weights drawn from the config) or from a checkpoint directory, file:///DIR (config.json and model.safetensors)", url))
	default:
		if err := coordinator.SetFixedString(cm.Checkpoint.Source.URL[:], modelspec.SeedConfigURL(src.Seed, path)); err != nil {
			errs = append(errs, fmt.Errorf("model.checkpoint.url with model.hf_config: %d bytes, at most %d", len(modelspec.SeedConfigURL(src.Seed, path)), coordinator.URLLen))
		}
		hash, what = modelspec.ConfigHash(data), path
	}
	switch rev := coordinator.FixedString(cm.Checkpoint.Source.Revision[:]); rev {
	case "":
		_ = coordinator.SetFixedString(cm.Checkpoint.Source.Revision[:], hash)
	case hash:
	default:
		errs = append(errs, fmt.Errorf("model.checkpoint.revision = %q, but %s hashes to %s (leave it out to take its hash)", rev, what, hash))
	}
	return errs
}

// refuseNegative names every negative integer in a run file. No key of a
// run file is a signed integer, and the TOML decoder would wrap -5 into an
// unsigned field as 2⁶⁴−5 (an epoch_time of 584 billion years, accepted).
func refuseNegative(path string) error {
	var raw map[string]any
	if _, err := toml.DecodeFile(path, &raw); err != nil {
		return tomlError(path, err)
	}
	var errs []error
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch v := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				name := k
				if prefix != "" {
					name = prefix + "." + k
				}
				walk(name, v[k])
			}
		case []any:
			for i, x := range v {
				walk(fmt.Sprintf("%s[%d]", prefix, i), x)
			}
		case []map[string]any:
			for i, x := range v {
				walk(fmt.Sprintf("%s[%d]", prefix, i), x)
			}
		case int64:
			if v < 0 {
				errs = append(errs, fmt.Errorf("%s = %d: must not be negative", prefix, v))
			}
		}
	}
	walk("", raw)
	return oneLine(path, errs)
}

// oneLine is a run file's violations as one error of one line: the file,
// then each violation with its key (coordinator rules, whose messages name
// the key without its table, get the table: config.global_batch_size_start),
// joined by "; ". It wraps every violation (errors.Is finds each), and is
// nil for none.
func oneLine(path string, errs []error) error {
	var msgs []string
	var kept []error
	for _, e := range errs {
		if e == nil {
			continue
		}
		// Validate returns its violations joined: one entry each.
		parts := []error{e}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			parts = j.Unwrap()
		}
		for _, p := range parts {
			msgs, kept = append(msgs, ruleKey(p)), append(kept, p)
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return &runFileError{msg: path + ": " + strings.Join(msgs, "; "), errs: kept}
}

// runFileError is oneLine's error.
type runFileError struct {
	msg  string
	errs []error
}

func (e *runFileError) Error() string   { return e.msg }
func (e *runFileError) Unwrap() []error { return e.errs }
