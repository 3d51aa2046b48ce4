//go:build cuda

package kernels

// cudaKernel names one kernel of cudaSource; the values index cudaKernelNames.
type cudaKernel int

const (
	kLayerNormForward cudaKernel = iota
	kLayerNormBackwardInput
	kLayerNormBackwardParams
	kGELUForward
	kGELUBackward
	kSoftmaxCrossEntropy
	kCrossEntropyBackward
	kCausalSoftmax
	kCausalSoftmaxBackward
	kRMSNormForward
	kRMSNormBackwardInput
	kRMSNormBackwardParams
	kRoPE
	kSwiGLUForward
	kSwiGLUBackward
	kAdd
	kAccumulate2
	kAddBias
	kBiasBackward
	kEmbed
	kEmbedBackward
	numCUDAKernels
)

// cudaKernelNames are the extern "C" names of the kernels in cudaSource, in
// cudaKernel order.
var cudaKernelNames = [numCUDAKernels]string{
	kLayerNormForward:        "layernorm_forward",
	kLayerNormBackwardInput:  "layernorm_backward_input",
	kLayerNormBackwardParams: "layernorm_backward_params",
	kGELUForward:             "gelu_forward",
	kGELUBackward:            "gelu_backward",
	kSoftmaxCrossEntropy:     "softmax_cross_entropy",
	kCrossEntropyBackward:    "cross_entropy_backward",
	kCausalSoftmax:           "causal_softmax",
	kCausalSoftmaxBackward:   "causal_softmax_backward",
	kRMSNormForward:          "rmsnorm_forward",
	kRMSNormBackwardInput:    "rmsnorm_backward_input",
	kRMSNormBackwardParams:   "rmsnorm_backward_params",
	kRoPE:                    "rope",
	kSwiGLUForward:           "swiglu_forward",
	kSwiGLUBackward:          "swiglu_backward",
	kAdd:                     "add",
	kAccumulate2:             "accumulate2",
	kAddBias:                 "add_bias",
	kBiasBackward:            "bias_backward",
	kEmbed:                   "embed",
	kEmbedBackward:           "embed_backward",
}

// cudaBlock is the block size of every launch (a multiple of the warp size:
// the row-wise kernels give each row one warp of 32 lanes).
const cudaBlock = 256

// cudaSource is the CUDA C of the kernels, compiled at run time by NVRTC. It
// computes the same math as the Go backend (gokernels.go), kernel by kernel.
//
// Launch shapes:
//   - element-wise kernels (gelu_*, cross_entropy_backward) and
//     layernorm_backward_params: one thread per element (per column), in
//     grid-stride loops;
//   - row-wise kernels (layernorm_forward, layernorm_backward_input,
//     softmax_cross_entropy): one warp per row, lanes striding over the
//     columns and combining their partial sums with a fixed butterfly of
//     warp shuffles, so results are deterministic; every lane of a warp
//     follows the same control flow, as __shfl_xor_sync with a full mask
//     requires;
//   - attention's row-wise parts (causal_softmax and its backward; the
//     products are cuBLAS's, see llama_cuda.go): one warp per row of the
//     t×t probabilities;
//   - rmsnorm_backward_params: one thread per column; rope: one thread per
//     (row, head, pair) with the angle from a cos/sin table the host
//     computes (so both backends rotate by the same float32 values);
//     swiglu_*: one thread per element;
//   - add, accumulate2, add_bias, embed: one thread per element;
//     bias_backward and embed_backward: one thread per column, summing rows
//     in order (no atomics, so repeated token ids sum the same way every
//     time).
//
// Sizes are int; offsets into tensors are computed in long long.
const cudaSource = `
#define FULL_MASK 0xffffffffu
#define GELU_SCALE 0.7978845608028654f
#define GELU_CUBE 0.044715f
#define LAYERNORM_EPS 1e-5

__device__ __forceinline__ double warp_sum_d(double v) {
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
	return v;
}

__device__ __forceinline__ float warp_sum_f(float v) {
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
	return v;
}

__device__ __forceinline__ float warp_max_f(float v) {
	for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
	return v;
}

__device__ __forceinline__ long long global_thread() {
	return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ long long global_threads() {
	return (long long)gridDim.x * blockDim.x;
}

// ---- layer norm ----

extern "C" __global__ void layernorm_forward(float* out, float* mean, float* rstd,
		const float* in, const float* weight, const float* bias, int rows, int cols) {
	int lane = threadIdx.x & 31;
	for (long long row = global_thread() >> 5; row < rows; row += global_threads() >> 5) {
		const float* x = in + row * cols;
		float* o = out + row * cols;
		double m = 0;
		for (int i = lane; i < cols; i += 32) m += (double)x[i];
		m = warp_sum_d(m) / cols;
		double var = 0;
		for (int i = lane; i < cols; i += 32) {
			double d = (double)x[i] - m;
			var += d * d;
		}
		var = warp_sum_d(var) / cols;
		double s = 1.0 / sqrt(var + LAYERNORM_EPS);
		for (int i = lane; i < cols; i += 32) o[i] = (float)(((double)x[i] - m) * s) * weight[i] + bias[i];
		if (lane == 0) {
			mean[row] = (float)m;
			rstd[row] = (float)s;
		}
	}
}

// dIn += (dnorm - mean(dnorm) - norm*mean(dnorm*norm))*rstd, dnorm = weight*dOut.
extern "C" __global__ void layernorm_backward_input(float* dIn, const float* dOut,
		const float* in, const float* weight, const float* mean, const float* rstd, int rows, int cols) {
	int lane = threadIdx.x & 31;
	for (long long row = global_thread() >> 5; row < rows; row += global_threads() >> 5) {
		const float* x = in + row * cols;
		const float* dy = dOut + row * cols;
		float* dx = dIn + row * cols;
		float m = mean[row], s = rstd[row];
		float dnormMean = 0, dnormNormMean = 0;
		for (int i = lane; i < cols; i += 32) {
			float norm = (x[i] - m) * s;
			float dnorm = weight[i] * dy[i];
			dnormMean += dnorm;
			dnormNormMean += dnorm * norm;
		}
		dnormMean = warp_sum_f(dnormMean) / cols;
		dnormNormMean = warp_sum_f(dnormNormMean) / cols;
		for (int i = lane; i < cols; i += 32) {
			float norm = (x[i] - m) * s;
			float dnorm = weight[i] * dy[i];
			dx[i] += (dnorm - dnormMean - norm * dnormNormMean) * s;
		}
	}
}

// One thread per column, looping over the rows: dWeight += Σ norm*dOut,
// dBias += Σ dOut, with no two threads writing the same element.
extern "C" __global__ void layernorm_backward_params(float* dWeight, float* dBias,
		const float* dOut, const float* in, const float* mean, const float* rstd, int rows, int cols) {
	for (long long j = global_thread(); j < cols; j += global_threads()) {
		float dw = 0, db = 0;
		for (long long r = 0; r < rows; r++) {
			float dy = dOut[r * cols + j];
			float norm = (in[r * cols + j] - mean[r]) * rstd[r];
			dw += norm * dy;
			db += dy;
		}
		dWeight[j] += dw;
		dBias[j] += db;
	}
}

// ---- GELU, tanh approximation ----

extern "C" __global__ void gelu_forward(float* out, const float* in, int n) {
	for (long long i = global_thread(); i < n; i += global_threads()) {
		float x = in[i];
		out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + GELU_CUBE * x * x * x)));
	}
}

extern "C" __global__ void gelu_backward(float* dIn, const float* in, const float* dOut, int n) {
	for (long long i = global_thread(); i < n; i += global_threads()) {
		float x = in[i];
		float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
		float th = tanhf(u);
		float sech2 = 1.0f - th * th;
		float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
		dIn[i] += grad * dOut[i];
	}
}

// ---- softmax and cross-entropy ----

// One warp per row: logits become probabilities in place, and the lane that
// holds the target writes the row's loss −log max(p[target], 1e-30).
extern "C" __global__ void softmax_cross_entropy(float* losses, float* logits,
		const unsigned int* targets, int rows, int vocab) {
	int lane = threadIdx.x & 31;
	for (long long row = global_thread() >> 5; row < rows; row += global_threads() >> 5) {
		float* x = logits + row * vocab;
		float maxv = -__int_as_float(0x7f800000);
		for (int i = lane; i < vocab; i += 32) maxv = fmaxf(maxv, x[i]);
		maxv = warp_max_f(maxv);
		double sum = 0;
		for (int i = lane; i < vocab; i += 32) {
			float e = expf(x[i] - maxv);
			x[i] = e;
			sum += (double)e;
		}
		sum = warp_sum_d(sum);
		float inv = (float)(1.0 / sum);
		int target = (int)targets[row];
		for (int i = lane; i < vocab; i += 32) {
			float p = x[i] * inv;
			x[i] = p;
			if (i == target) losses[row] = -(float)log(fmax((double)p, 1e-30));
		}
	}
}

// dLogits = (probs − onehot(target))·scale, overwriting dLogits.
extern "C" __global__ void cross_entropy_backward(float* dLogits, const float* probs,
		const unsigned int* targets, int rows, int vocab, float scale) {
	long long total = (long long)rows * vocab;
	for (long long idx = global_thread(); idx < total; idx += global_threads()) {
		long long row = idx / vocab;
		int i = (int)(idx % vocab);
		float d = probs[idx] * scale;
		if (i == (int)targets[row]) d -= scale;
		dLogits[idx] = d;
	}
}

// ---- attention: the row-wise parts (the products are cuBLAS's) ----

// Row ti (of rows rows of T; ti = row mod T): softmax over [0, ti], zero
// beyond (the causal mask), in place.
extern "C" __global__ void causal_softmax(float* att, int rows, int T) {
	int lane = threadIdx.x & 31;
	for (long long row = global_thread() >> 5; row < rows; row += global_threads() >> 5) {
		float* x = att + row * T;
		int ti = (int)(row % T);
		float maxv = -__int_as_float(0x7f800000);
		for (int i = lane; i <= ti; i += 32) maxv = fmaxf(maxv, x[i]);
		maxv = warp_max_f(maxv);
		float sum = 0;
		for (int i = lane; i <= ti; i += 32) {
			float e = expf(x[i] - maxv);
			x[i] = e;
			sum += e;
		}
		sum = warp_sum_f(sum);
		float inv = 1.0f / sum;
		for (int i = lane; i < T; i += 32) x[i] = i <= ti ? x[i] * inv : 0.0f;
	}
}

// datt holds dP; it becomes dS = P ⊙ (dP − Σ P ⊙ dP)·scale, row by row.
extern "C" __global__ void causal_softmax_backward(float* datt, const float* att, int rows, int T, float scale) {
	int lane = threadIdx.x & 31;
	for (long long row = global_thread() >> 5; row < rows; row += global_threads() >> 5) {
		float* d = datt + row * T;
		const float* p = att + row * T;
		int ti = (int)(row % T);
		float s = 0;
		for (int i = lane; i <= ti; i += 32) s += p[i] * d[i];
		s = warp_sum_f(s);
		for (int i = lane; i < T; i += 32) d[i] = i <= ti ? p[i] * (d[i] - s) * scale : 0.0f;
	}
}

// ---- RMS norm ----

extern "C" __global__ void rmsnorm_forward(float* out, float* rstd, const float* in,
		const float* weight, int rows, int cols, float eps) {
	int lane = threadIdx.x & 31;
	for (long long row = global_thread() >> 5; row < rows; row += global_threads() >> 5) {
		const float* x = in + row * cols;
		float* o = out + row * cols;
		double ss = 0;
		for (int i = lane; i < cols; i += 32) ss += (double)x[i] * (double)x[i];
		ss = warp_sum_d(ss);
		float s = (float)(1.0 / sqrt(ss / cols + (double)eps));
		for (int i = lane; i < cols; i += 32) o[i] = x[i] * s * weight[i];
		if (lane == 0) rstd[row] = s;
	}
}

// dIn += s·w·dOut − x·s³·mean(w·dOut·x).
extern "C" __global__ void rmsnorm_backward_input(float* dIn, const float* dOut,
		const float* in, const float* weight, const float* rstd, int rows, int cols) {
	int lane = threadIdx.x & 31;
	for (long long row = global_thread() >> 5; row < rows; row += global_threads() >> 5) {
		const float* x = in + row * cols;
		const float* dy = dOut + row * cols;
		float* dx = dIn + row * cols;
		float s = rstd[row];
		float dot = 0;
		for (int i = lane; i < cols; i += 32) dot += weight[i] * dy[i] * x[i];
		dot = warp_sum_f(dot);
		float k = dot * s * s * s / cols;
		for (int i = lane; i < cols; i += 32) dx[i] += s * weight[i] * dy[i] - x[i] * k;
	}
}

extern "C" __global__ void rmsnorm_backward_params(float* dWeight, const float* dOut,
		const float* in, const float* rstd, int rows, int cols) {
	for (long long j = global_thread(); j < cols; j += global_threads()) {
		float dw = 0;
		for (long long r = 0; r < rows; r++) dw += dOut[r * cols + j] * in[r * cols + j] * rstd[r];
		dWeight[j] += dw;
	}
}

// ---- rotary position embedding, rotate-half layout ----
//
// cs holds T·half cos values then T·half sin values; sign is 1 or −1 (the
// inverse rotation).
extern "C" __global__ void rope(float* x, const float* cs, int rows, int T, int stride,
		int heads, int hd, float sign) {
	int half = hd / 2;
	long long total = (long long)rows * heads * half;
	for (long long idx = global_thread(); idx < total; idx += global_threads()) {
		int i = (int)(idx % half);
		long long rh = idx / half;
		int h = (int)(rh % heads);
		long long r = rh / heads;
		int p = (int)(r % T);
		float c = cs[p * half + i], s = sign * cs[(long long)T * half + p * half + i];
		float* v = x + r * stride + h * hd;
		float x0 = v[i], x1 = v[i + half];
		v[i] = x0 * c - x1 * s;
		v[i + half] = x1 * c + x0 * s;
	}
}

// ---- SwiGLU ----

__device__ __forceinline__ float sigmoidf_(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

extern "C" __global__ void swiglu_forward(float* out, const float* gateUp, int rows, int n) {
	long long total = (long long)rows * n;
	for (long long idx = global_thread(); idx < total; idx += global_threads()) {
		long long r = idx / n;
		int i = (int)(idx % n);
		float g = gateUp[r * 2 * n + i], u = gateUp[r * 2 * n + n + i];
		out[idx] = g * sigmoidf_(g) * u;
	}
}

extern "C" __global__ void swiglu_backward(float* dGateUp, const float* gateUp, const float* dOut, int rows, int n) {
	long long total = (long long)rows * n;
	for (long long idx = global_thread(); idx < total; idx += global_threads()) {
		long long r = idx / n;
		int i = (int)(idx % n);
		float g = gateUp[r * 2 * n + i], u = gateUp[r * 2 * n + n + i];
		float sg = sigmoidf_(g), d = dOut[idx];
		dGateUp[r * 2 * n + i] += d * u * sg * (1.0f + g * (1.0f - sg));
		dGateUp[r * 2 * n + n + i] += d * g * sg;
	}
}

// ---- residual stream, biases, embeddings ----

extern "C" __global__ void add(float* out, const float* a, const float* b, int n) {
	for (long long i = global_thread(); i < n; i += global_threads()) out[i] = a[i] + b[i];
}

// d0 += src and, when d1 is not null, d1 += src.
extern "C" __global__ void accumulate2(float* d0, float* d1, const float* src, int n) {
	for (long long i = global_thread(); i < n; i += global_threads()) {
		float v = src[i];
		d0[i] += v;
		if (d1) d1[i] += v;
	}
}

extern "C" __global__ void add_bias(float* out, const float* bias, int rows, int cols) {
	long long n = (long long)rows * cols;
	for (long long i = global_thread(); i < n; i += global_threads()) out[i] += bias[i % cols];
}

extern "C" __global__ void bias_backward(float* dBias, const float* dOut, int rows, int cols) {
	for (long long j = global_thread(); j < cols; j += global_threads()) {
		float s = 0;
		for (int r = 0; r < rows; r++) s += dOut[(long long)r * cols + j];
		dBias[j] += s;
	}
}

extern "C" __global__ void embed(float* out, const float* table, const unsigned int* ids, int rows, int cols, int add) {
	long long n = (long long)rows * cols;
	for (long long i = global_thread(); i < n; i += global_threads()) {
		long long r = i / cols, j = i % cols;
		float v = table[(long long)ids[r] * cols + j];
		out[i] = add ? out[i] + v : v;
	}
}

extern "C" __global__ void embed_backward(float* dTable, const float* dOut, const unsigned int* ids, int rows, int cols) {
	for (long long j = global_thread(); j < cols; j += global_threads()) {
		for (int r = 0; r < rows; r++) dTable[(long long)ids[r] * cols + j] += dOut[(long long)r * cols + j];
	}
}
`
