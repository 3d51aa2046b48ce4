package simscale

import (
	_ "embed"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// programCosts is the output of scripts/bench-program (compute units of
// every instruction of the on-chain coordinator program, through real
// transactions on the local validator at 4, 64 and 256 clients), captured
// on 2026-11-27 at commit 6651395. The simulation runs the server backend;
// these measurements price the same instructions on Solana.
//
//go:embed program_costs.txt
var programCosts string

// costRow is one instruction's compute units at 4, 64 and 256 clients.
type costRow [3]float64

var costClients = [3]float64{4, 64, 256}

// parseCosts reads the table of programCosts by its row labels.
func parseCosts(text string) (map[string]costRow, error) {
	row := regexp.MustCompile(`^(\S.*?)\s+(\d+)\s+(\d+)\s+(\d+)\s+[\d.]+\s+(?:[\d.]+|-)$`)
	out := map[string]costRow{}
	for _, line := range strings.Split(text, "\n") {
		m := row.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		var r costRow
		for i := range r {
			v, err := strconv.ParseFloat(m[i+2], 64)
			if err != nil {
				return nil, err
			}
			r[i] = v
		}
		out[m[1]] = r
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("simscale: no rows in the program costs")
	}
	return out, nil
}

// at interpolates a row linearly in the number of clients (and holds its
// ends beyond them).
func (r costRow) at(clients int) float64 {
	n := float64(clients)
	switch {
	case n <= costClients[0]:
		return r[0]
	case n >= costClients[2]:
		return r[2]
	case n <= costClients[1]:
		return r[0] + (r[1]-r[0])*(n-costClients[0])/(costClients[1]-costClients[0])
	}
	return r[1] + (r[2]-r[1])*(n-costClients[1])/(costClients[2]-costClients[1])
}

// costLabel names the row of programCosts that prices an instruction the
// server applied: ticks by the transition they made (a tick that changes
// nothing fails in preflight on chain and costs nothing).
func costLabel(name, from, to string) string {
	if name != "tick" {
		return name
	}
	switch from + "->" + to {
	case "RoundTrain->RoundWitness":
		return "tick RoundTrain->RoundWitness (train time over)"
	case "RoundWitness->RoundTrain":
		return "tick RoundWitness->RoundTrain (next round)"
	case "RoundWitness->Cooldown":
		return "tick RoundWitness->Cooldown (last step)"
	case "Warmup->RoundTrain":
		return "tick Warmup->RoundTrain (warmup time over)"
	case "WaitingForMembers->Warmup":
		return "tick WaitingForMembers->Warmup"
	}
	return "tick (nothing due)"
}
