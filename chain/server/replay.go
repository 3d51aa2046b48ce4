package server

import "github.com/psyche-go/psyche/coordinator"

// replayTable is a run's replay protection. A request carries a sequence
// number (clients use the server's clock in nanoseconds, see Binding) and is
// refused unless:
//
//   - it lies within the server's request window of the server's clock:
//     requests expire, as Solana transactions do with their blockhash, so a
//     captured request that was refused (nothing refused is stored) can only
//     be replayed for a bounded time;
//   - it is above the sender's entry, if the sender has one;
//   - otherwise, it is above floor.
//
// Entries are kept only for signers the run knows (its authorities, the
// epoch's clients and exited clients, the pending joiners) and only after
// an instruction of theirs changed the run: an anonymous key can make the
// server verify a signature, never store anything. When a signer stops
// being known its entry is dropped and floor rises to its sequence, so its
// captured requests stay refused; floor cannot be pushed beyond the window
// ahead of the clock, because no such sequence is ever accepted.
type replayTable struct {
	seqs  map[coordinator.Pubkey]uint64
	floor uint64
}

// last is the sequence a sender's next request must exceed.
func (t *replayTable) last(sender coordinator.Pubkey) uint64 {
	if s, ok := t.seqs[sender]; ok {
		return max(s, t.floor)
	}
	return t.floor
}

// record stores a sender's sequence after its instruction changed the run
// (st, the new state) if the run knows it, then drops every entry the run no
// longer knows. It returns the table to persist; t is not modified, so a
// failed write leaves the served table as it was. The copy is bounded by
// the run's known signers (at most 2 + 256 + 512 + 256 entries).
func (t *replayTable) record(st *coordinator.Coordinator, sender coordinator.Pubkey, seq uint64) replayTable {
	known := knownSigners(st)
	out := replayTable{seqs: make(map[coordinator.Pubkey]uint64, len(known)), floor: t.floor}
	for k, v := range t.seqs {
		if _, ok := known[k]; ok {
			out.seqs[k] = v
		} else {
			out.floor = max(out.floor, v)
		}
	}
	if _, ok := known[sender]; ok && seq != 0 {
		out.seqs[sender] = max(out.seqs[sender], seq)
	}
	return out
}

// knownSigners is every key the run knows: the ones that may send it
// instructions other than tick and a first join.
func knownSigners(st *coordinator.Coordinator) map[coordinator.Pubkey]struct{} {
	known := make(map[coordinator.Pubkey]struct{}, 2+int(st.Epoch.ClientsLen)+int(st.Epoch.ExitedLen)+int(st.PendingLen))
	known[st.MainAuthority] = struct{}{}
	if !st.JoinAuthority.IsZero() {
		known[st.JoinAuthority] = struct{}{}
	}
	for _, c := range st.Epoch.Clients[:st.Epoch.ClientsLen] {
		known[c.ID.Signer] = struct{}{}
	}
	for _, c := range st.Epoch.Exited[:st.Epoch.ExitedLen] {
		known[c.ID.Signer] = struct{}{}
	}
	for _, p := range st.Pending[:st.PendingLen] {
		known[p.Signer] = struct{}{}
	}
	return known
}
