module github.com/psyche-go/psyche

go 1.26.8

require (
	github.com/bits-and-blooms/bloom/v3 v3.7.0
	github.com/urfave/cli/v2 v2.27.7
	gonum.org/v1/gonum v0.17.0
	gonum.org/v1/netlib v0.0.0-20230729102104-8b8060e7531f
	gorgonia.org/cu v0.9.6
)

require (
	github.com/bits-and-blooms/bitset v1.10.0 // indirect
	github.com/cpuguy83/go-md2man/v2 v2.0.7 // indirect
	github.com/google/uuid v1.1.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/russross/blackfriday/v2 v2.1.0 // indirect
	github.com/xrash/smetrics v0.0.0-20240521201337-686a1a2994c1 // indirect
)
