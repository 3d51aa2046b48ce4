package torch

// The requests psyche sends its worker, one type an op (the worker's side:
// worker/ops.py's handlers and protocol.py's request types). The answers'
// fields are read into the types beside each call. Every request's header
// is JSON; its blobs follow it (wire.go).

// opName is a request's op: one of protocol.json's ops, each answered by
// one handler of the worker (ops.py checks it has one for every op the file
// declares; this side, that the file declares every op it sends).
type opName string

const (
	opHello    opName = "hello"
	opDescribe opName = "describe"
	opOpen     opName = "open"
	opGradient opName = "gradient"
	opLosses   opName = "losses"
	opStep     opName = "step"
	opApply    opName = "apply"
	opTry      opName = "try"
	opUndo     opName = "undo"
	opRead     opName = "read"
	opParams   opName = "params"
	opStats    opName = "stats"
	// The tests' ops (hooks_test.go).
	opGrads    opName = "grads"
	opSetGrads opName = "set_grads"
	opDigests  opName = "digests"
)

var goOps = []opName{opHello, opDescribe, opOpen, opGradient, opLosses, opStep, opApply, opTry, opUndo, opRead,
	opParams, opStats, opGrads, opSetGrads, opDigests}

// op is what every request carries: its name, and the byte length of each
// blob that follows (set by writeMessage).
type op struct {
	Op    opName `json:"op"`
	Blobs []int  `json:"blobs"`
}

// request is any request: writeMessage sets its blobs, errors name its op.
type request interface {
	header() *op
}

func (o *op) header() *op { return o }

// helloRequest starts the worker on its devices; timeout bounds the ranks'
// collectives.
type helloRequest struct {
	op
	Protocol int      `json:"protocol"`
	Device   string   `json:"device"`
	Devices  []string `json:"devices,omitempty"`
	Timeout  float64  `json:"timeout,omitempty"` // seconds
}

// describeRequest asks for a transformers config's parameter names and
// shapes.
type describeRequest struct {
	op
	Config map[string]any `json:"config"`
}

// layout is one tensor's DisTrO tiling (distro.TileLayout).
type layout struct {
	Shape []int `json:"shape"`
	Outer int   `json:"outer"`
	Rows  int   `json:"rows"`
	Cols  int   `json:"cols"`
	TileH int   `json:"th"`
	TileW int   `json:"tw"`
	K     int   `json:"k"`
}

// distroOptions are the run's optimizer options the worker's DisTrO takes.
type distroOptions struct {
	Decay        float32 `json:"decay"`
	WeightDecay  float32 `json:"weight_decay"`
	Clip         float32 `json:"clip"`
	Quantize     bool    `json:"quantize"`
	NormalizeRMS bool    `json:"normalize_rms"`
	MaxValue     float32 `json:"max_value"`
}

// openRequest opens a model: the weights follow as one float32 blob a
// tensor, unless Seed is set (a transformers model drawn by the worker).
type openRequest struct {
	op
	Arch      string         `json:"arch"`
	Config    map[string]any `json:"config"`
	Seed      *uint64        `json:"seed"`
	Layouts   []layout       `json:"layouts"`
	Shapes    [][]int        `json:"shapes"`
	Distro    distroOptions  `json:"distro"`
	Precision string         `json:"precision"`
	Compile   bool           `json:"compile"`
	Placement string         `json:"placement"`
}

// batchRequest is a gradient's or losses' batch of B sequences of T tokens:
// inputs and targets follow as uint32 blobs.
type batchRequest struct {
	op
	B int `json:"b"`
	T int `json:"t"`
}

// lrRequest is a step's, apply's or try's learning rate (an apply and a
// try: a round's distro.Combined follows, three blobs a tensor).
type lrRequest struct {
	op
	LR float32 `json:"lr"`
}

// statsRequest asks for device memory; Reset restarts the peak's count.
type statsRequest struct {
	op
	Reset bool `json:"reset"`
}

// readRequest asks for values [Offset, Offset+Count) of parameter tensor
// Tensor (Shapes' order): one float32 blob answers.
type readRequest struct {
	op
	Tensor int `json:"tensor"`
	Offset int `json:"offset"`
	Count  int `json:"count"`
}

// bare is a request of no fields (undo, params, and the tests' ops).
func bare(name opName) *op { return &op{Op: name} }
