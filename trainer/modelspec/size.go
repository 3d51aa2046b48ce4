package modelspec

// Size is the number of elements of a tensor of the given shape.
func Size(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// numParams is the number of values in tensors of the given shapes.
func numParams(shapes [][]int) int {
	n := 0
	for _, s := range shapes {
		n += Size(s)
	}
	return n
}

// NumParams is the number of values in tensors of the given shapes.
func NumParams(shapes [][]int) int { return numParams(shapes) }
