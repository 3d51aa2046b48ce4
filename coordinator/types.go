package coordinator

// Fixed capacities. Every list in the state has a fixed capacity so that the
// whole coordinator maps 1:1 onto the bytes of one Solana account.
const (
	MaxClients        = 256 // clients in one epoch, and pending joiners
	MaxExitedClients  = 2 * MaxClients
	MaxWitnesses      = 32 // witnesses per round
	NumRounds         = 4  // rounds kept in the ring
	MaxRunIDLen       = 32
	BloomWords        = 40 // 2560-bit witness blooms
	BloomHashes       = 7
	NameLen           = 64
	DescriptionLen    = 128
	URLLen            = 128
	RevisionLen       = 32
	StoreURLLen       = 64 // s3://bucket/prefix; leaves room for /<run id>/step-N in a URLLen checkpoint URL
	RegionLen         = 32
	shuffleRounds     = 90
	maxWarmupTokens   = 1 << 47 // keeps (batch_end-batch_start)*tokens inside u64
	maxVerificationPc = 0       // verifier committees are not implemented yet
)

// Pubkey is a 32-byte ed25519 public key (a Solana address or a libp2p key).
type Pubkey [32]byte

// IsZero reports whether k is the all-zero key.
func (k Pubkey) IsZero() bool { return k == Pubkey{} }

// Hash is a sha256 digest.
type Hash [32]byte

// RunState is the phase of a run.
type RunState uint8

const (
	Uninitialized RunState = iota
	WaitingForMembers
	Warmup
	RoundTrain
	RoundWitness
	Cooldown
	Finished
	Paused
	numRunStates
)

var runStateNames = [...]string{"Uninitialized", "WaitingForMembers", "Warmup", "RoundTrain",
	"RoundWitness", "Cooldown", "Finished", "Paused"}

func (s RunState) String() string {
	if s < numRunStates {
		return runStateNames[s]
	}
	return "RunState(?)"
}

// Halted reports whether the run is in a state where nothing trains and
// config, model and progress may be changed.
func (s RunState) Halted() bool { return s == Uninitialized || s == Finished || s == Paused }

// ClientState is the health of an epoch member.
type ClientState uint8

const (
	Healthy   ClientState = iota
	Dropped               // failed a health check
	Withdrawn             // removed because the epoch or warmup was abandoned
	Ejected               // reserved for verifier disputes
	numClientStates
)

var clientStateNames = [...]string{"Healthy", "Dropped", "Withdrawn", "Ejected"}

func (s ClientState) String() string {
	if s < numClientStates {
		return clientStateNames[s]
	}
	return "ClientState(?)"
}

// ClientID identifies a trainer: the key that signs its instructions and the
// libp2p identity it uses to talk to peers.
type ClientID struct {
	Signer Pubkey
	P2P    Pubkey
}

// Client is an epoch member or an exited former member.
type Client struct {
	ID    ClientID
	State ClientState
	_     [3]byte
	// ExitedHeight is the round height at which the client left the epoch
	// (0 while it is a member).
	ExitedHeight uint32
}

// WitnessProof claims that a client holds a committee position in a round.
// The coordinator recomputes the position from the round seed, so a proof is
// only a hint that makes verification O(1) instead of O(n).
type WitnessProof struct {
	Position  uint16
	Index     uint16
	IsWitness bool
	_         [3]byte
}

// WitnessMetadata is what a witness reports about its own training step.
// The coordinator checks only Step; the rest is for people (the run
// explorer draws the loss curve and the run's rates from it).
type WitnessMetadata struct {
	Step            uint32
	TokensPerSec    float32 // tokens of the witness's batch over the seconds it took to train and publish it
	BandwidthPerSec float32 // result bytes it published for the batch over those seconds
	Loss            float32 // training loss of its batch
}

// Bloom is a witness bloom filter: 2560 bits as 40 little-endian words, bit i
// in word i/64 at position i%64 (the bitset layout of bits-and-blooms/bloom/v3).
type Bloom [BloomWords]uint64

// Witness is one witness's report on a round.
type Witness struct {
	Proof WitnessProof
	// Key salts every member added to the two blooms, so that the false
	// positives of different witnesses are independent.
	Key          uint64
	Participants Bloom // sha256(signer) of each trainer whose result was received and verified
	Broadcasts   Bloom // commitment hash of the first verified result per batch
	Merkle       Hash  // root over what the witness applied
	Metadata     WitnessMetadata
}

// Round is one training step of an epoch.
type Round struct {
	Witnesses    [MaxWitnesses]Witness
	DataIndex    uint64
	RandomSeed   uint64
	Height       uint32
	ClientsLen   uint16
	WitnessesLen uint8
	_            uint8
}

// EpochState is everything that is reset when an epoch starts.
type EpochState struct {
	Rounds         [NumRounds]Round
	Clients        [MaxClients]Client
	Exited         [MaxExitedClients]Client
	StartTimestamp uint64
	StartStep      uint32
	// LastStep, when non-zero, is the step at which the epoch ends (set two
	// steps ahead once the epoch timer expires, so the last results apply).
	LastStep     uint32
	ClientsLen   uint16
	ExitedLen    uint16
	CurrentRound uint8 // ring slot of the current round
	FirstRound   bool
	ColdStart    bool // the model must be loaded from the checkpoint source, not from peers
	Checkpointed bool // a checkpoint was recorded in this epoch's cooldown
}

// Metadata describes a run to people; it may change at any time.
type Metadata struct {
	Name          [NameLen]byte
	Description   [DescriptionLen]byte
	NumParameters uint64
	VocabSize     uint64
}

// Config is the run's schedule. Times are unix seconds.
type Config struct {
	// WarmupTime is how long clients have to load the model (suggested 60).
	WarmupTime uint64
	// CooldownTime is how long checkpointers have to save the model (suggested 60).
	CooldownTime uint64
	// MaxRoundTrainTime bounds RoundTrain when witnesses are slow (suggested 30).
	MaxRoundTrainTime uint64
	// RoundWitnessTime is the slack for late witnesses (suggested 5).
	RoundWitnessTime uint64
	// EpochTime is the target length of an epoch (suggested 600).
	EpochTime uint64
	// WaitingForMembersExtraTime is how long to wait for more joiners once
	// enough are pending (suggested 3).
	WaitingForMembersExtraTime uint64
	// GlobalBatchSizeWarmupTokens is the number of tokens over which the
	// batch size ramps from start to end (0: no ramp). At most 2^47.
	GlobalBatchSizeWarmupTokens uint64
	// TotalSteps is the number of optimizer steps of the whole run.
	TotalSteps uint32
	// GlobalBatchSizeStart and End are batch sizes in sequences.
	GlobalBatchSizeStart uint16
	GlobalBatchSizeEnd   uint16
	// InitMinClients is the number of joiners needed to start an epoch.
	InitMinClients uint16
	// MinClients is the number of healthy clients needed to keep training.
	MinClients uint16
	// WitnessNodes is the number of witnesses per round (0: min(clients, 32)).
	WitnessNodes uint16
	// VerificationPercent is the share of a round's trainers whose results
	// its witnesses score (0..100; 0: none): the trainers read it, the
	// coordinator only keeps it. Every client trains; there are no verifier
	// committees (see trainer/node's verification).
	VerificationPercent uint8
	_                   [1]byte
}

// CheckpointKind says where clients get the model from.
type CheckpointKind uint8

const (
	CheckpointNone      CheckpointKind = iota // not configured: a run cannot start
	CheckpointEphemeral                       // rejected: a run must be recoverable
	CheckpointHub                             // download from URL at Revision
	CheckpointP2P                             // fetch from the previous epoch's clients; URL is the fallback
	numCheckpointKinds
)

var checkpointKindNames = [...]string{"None", "Ephemeral", "Hub", "P2P"}

func (k CheckpointKind) String() string {
	if k < numCheckpointKinds {
		return checkpointKindNames[k]
	}
	return "CheckpointKind(?)"
}

// CheckpointSource is a model location: an http(s) or file URL and a revision.
type CheckpointSource struct {
	URL      [URLLen]byte
	Revision [RevisionLen]byte
}

// Checkpoint is the current model source.
type Checkpoint struct {
	Kind   CheckpointKind
	_      [7]byte
	Source CheckpointSource
}

// Architecture is the model family.
type Architecture uint8

const (
	ArchNone  Architecture = iota
	ArchGPT                // GPT-style decoder (docs/architecture.md §8)
	ArchLlama              // Llama-family decoder (trainer/llama): RMSNorm, RoPE, GQA, SwiGLU
	// ArchTransformers is any Hugging Face transformers causal LM, described
	// by its config.json, which the checkpoint source names (a
	// fixed-size account cannot hold a config): only the PyTorch engine
	// builds it. DModel, NLayers and NHeads mirror the config; the Llama
	// fields are zero.
	ArchTransformers
	numArchitectures
)

// The names are the IDL's enum variants (programs/coordinator derives them
// from String), so an IDL client decodes the byte as a named value.
var architectureNames = [numArchitectures]string{"None", "GPT", "Llama", "Transformers"}

func (a Architecture) String() string {
	if a < numArchitectures {
		return architectureNames[a]
	}
	return "Architecture(?)"
}

// DataKind is the kind of training data location.
type DataKind uint8

const (
	DataNone  DataKind = iota
	DataLocal          // a token file path on every trainer
	DataHTTP           // a token file served over http(s) with range requests
	numDataKinds
)

var dataKindNames = [...]string{"None", "Local", "HTTP"}

func (k DataKind) String() string {
	if k < numDataKinds {
		return dataKindNames[k]
	}
	return "DataKind(?)"
}

// LRScheduleKind is the learning-rate schedule.
type LRScheduleKind uint8

const (
	LRNone LRScheduleKind = iota
	LRConstant
	LRLinear
	LRCosine
	LRWarmupStableDecay
	numLRSchedules
)

var lrScheduleNames = [...]string{"None", "Constant", "Linear", "Cosine", "WarmupStableDecay"}

func (k LRScheduleKind) String() string {
	if k < numLRSchedules {
		return lrScheduleNames[k]
	}
	return "LRScheduleKind(?)"
}

// LRSchedule is a learning-rate schedule over optimizer steps.
type LRSchedule struct {
	Kind        LRScheduleKind
	_           [3]byte
	BaseLR      float32
	FinalLR     float32
	WarmupSteps uint32
	DecaySteps  uint32 // linear/cosine: steps from warmup end to FinalLR; WSD: length of the decay tail
	TotalSteps  uint32 // WSD: step at which the decay tail ends
}

// OptimizerKind is the optimizer.
type OptimizerKind uint8

const (
	OptimizerNone OptimizerKind = iota
	OptimizerAdamW
	OptimizerDistro
	numOptimizers
)

var optimizerNames = [...]string{"None", "AdamW", "Distro"}

func (k OptimizerKind) String() string {
	if k < numOptimizers {
		return optimizerNames[k]
	}
	return "OptimizerKind(?)"
}

// Aggregation is how trainers combine the DisTrO results of a round before
// applying them. It is consensus (every trainer must apply the same rule, or
// their models drift apart), so it lives in the run's model;
// trainer/modelspec maps it to distro.Aggregation, which documents the rules.
// The zero value is the robust rule, so a model that does not name one (and
// an account written before the field existed, where its byte was padding)
// gets the default.
type Aggregation uint8

const (
	// AggregationRobust: every peer's tile clipped to the round's median
	// tile norm, then a coordinate-wise trimmed mean (float values) or a
	// majority vote (1-bit signs); an index sent by fewer than
	// min(peers, 3) peers is weighed down so that no peer counts for more
	// than 1/3 of a coefficient it alone chose.
	AggregationRobust Aggregation = iota
	// AggregationMean: the per-index mean of the senders' values (Psyche's
	// rule, docs/architecture.md §6).
	AggregationMean
	// AggregationClippedMean: median tile-norm clipping, then the mean.
	AggregationClippedMean
	numAggregations
)

var aggregationNames = [...]string{"Robust", "Mean", "ClippedMean"}

func (a Aggregation) String() string {
	if a < numAggregations {
		return aggregationNames[a]
	}
	return "Aggregation(?)"
}

// Normalization is what a DisTrO trainer folds into its momentum: each
// gradient coefficient as it is, or divided by its own running RMS. It is
// not consensus in the way Aggregation is (a trainer's compression is its
// own, and every result decodes and aggregates the same either way), but
// it is the run's optimizer, so the run's model names it. The zero value is
// RMS, the default, so an account written before the field existed, where
// its byte was padding, gets it.
type Normalization uint8

const (
	// NormalizationRMS: each coefficient of the gradient's DCT divided by
	// the root of its running mean square (decay 0.95) before the momentum.
	NormalizationRMS Normalization = iota
	// NormalizationNone: DeMo's raw gradient.
	NormalizationNone
	numNormalizations
)

var normalizationNames = [...]string{"Rms", "None"}

func (n Normalization) String() string {
	if n < numNormalizations {
		return normalizationNames[n]
	}
	return "Normalization(?)"
}

// Optimizer holds the hyper-parameters of either optimizer; Kind says which
// fields apply (AdamW: Beta1, Beta2, Epsilon, WeightDecay, ClipGradNorm;
// DisTrO: ClipGradNorm, WeightDecay, CompressionDecay, TopK, Chunk,
// Quantize1Bit, Aggregation, Normalization).
type Optimizer struct {
	Kind             OptimizerKind
	Quantize1Bit     bool
	CompressionTopK  uint16
	CompressionChunk uint16
	Aggregation      Aggregation   // one of the two bytes that were padding here: no offset moved
	Normalization    Normalization // the other one
	ClipGradNorm     float32
	WeightDecay      float32
	CompressionDecay float32
	Beta1            float32
	Beta2            float32
	Epsilon          float32
}

// Model is what is trained and from where.
type Model struct {
	Architecture Architecture
	DataKind     DataKind
	TokenSize    uint8 // bytes per token in the data file: 2 or 4
	_            uint8
	MaxSeqLen    uint32
	VocabSize    uint32
	DModel       uint32
	NLayers      uint32
	NHeads       uint32
	// Llama only (zero for GPT): key/value heads (dividing NHeads), the
	// MLP's hidden size, the rotary base θ, and whether the output head is
	// the embedding matrix.
	NKVHeads         uint32
	IntermediateSize uint32
	RopeTheta        float32
	TiedHead         bool
	_                [3]byte
	Checkpoint       Checkpoint
	DataLocation     [URLLen]byte
	LR               LRSchedule
	Optimizer        Optimizer
	// Store is where elected checkpointers upload the model at the end of
	// an epoch; all zero: the checkpoint stays on their disks and is
	// offered P2P.
	Store CheckpointStore
}

// CheckpointStore names an S3-compatible bucket (AWS S3, Google Cloud
// Storage's XML API, Cloudflare R2, MinIO…). Credentials never live here:
// each trainer takes them from its own environment.
type CheckpointStore struct {
	// URL is s3://bucket or s3://bucket/prefix (no trailing slash).
	URL [StoreURLLen]byte
	// Endpoint is the service's http(s)://host[:port]; empty: AWS S3.
	Endpoint [URLLen]byte
	// Region is the bucket's region (empty: the service's default).
	Region [RegionLen]byte
}

// Progress is where the run stands; it may be rewritten while halted.
type Progress struct {
	Epoch               uint32
	Step                uint32
	EpochStartDataIndex uint64
}

// Coordinator is the whole state of one run.
type Coordinator struct {
	// Nonce increases on every mutation, so that subscribers can drop
	// snapshots that are not newer than the one they have.
	Nonce         uint64
	RunID         [MaxRunIDLen]byte
	MainAuthority Pubkey
	JoinAuthority Pubkey // zero: anyone may join
	RunState      RunState
	PendingPause  bool
	_             [6]byte
	RunStateStart uint64
	Metadata      Metadata
	Config        Config
	Model         Model
	Progress      Progress
	Epoch         EpochState
	Pending       [MaxClients]ClientID
	PendingLen    uint16
	_             [6]byte
	// NextRoundSeed is the seed the epoch's next training round will use:
	// drawn when the round before it starts (the first round's when the
	// warmup starts), so that trainers know that round's data assignment
	// one round early and train it while this one is witnessed (docs/architecture.md
	// §3.6). Appended at the end of the account: no offset moved.
	NextRoundSeed uint64
}
