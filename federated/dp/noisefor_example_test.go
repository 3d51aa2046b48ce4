package dp

import "fmt"

// The noise multiplier that spends ε = 8 at δ = 1e-5 over 20 rounds in
// which every client takes part (q = 1), as scripts/bench-disco's DP run
// asks for it.
func ExampleNoiseFor() {
	sigma, _ := NoiseFor(8, 1, 20, 1e-5)
	eps, _, _ := Accountant{Q: 1, Sigma: sigma}.Spent(20, 1e-5)
	fmt.Printf("σ = %.3f, ε = %.3f\n", sigma, eps)
	// Output: σ = 2.852, ε = 8.000
}
