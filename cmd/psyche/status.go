package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/explorer"
	"github.com/urfave/cli/v2"
)

// statusView is what `psyche status --json` prints.
type statusView struct {
	RunID        string `json:"run_id"`
	State        string `json:"state"`
	StateSince   uint64 `json:"state_since"`
	Epoch        uint32 `json:"epoch"`
	Step         uint32 `json:"step"`
	Nonce        uint64 `json:"nonce"`
	PendingPause bool   `json:"pending_pause"`
	// Waiting, in WaitingForMembers: what the run needs to start its next
	// epoch, and how long it has waited.
	Waiting *waitingView `json:"waiting,omitempty"`
	// Members lists every client the run holds once, with its latest
	// state: the coordinator's three lists below name one client in
	// several (a trainer that stopped was both a member of the last epoch
	// and a removal of this one).
	Members []clientView `json:"members"`
	Clients []clientView `json:"clients"`
	Pending []string     `json:"pending"`
	Exited  []clientView `json:"exited"`
	Round   *roundView   `json:"round,omitempty"`
	// Unattended, in a round nobody has reported in for a while: that no
	// trainer may be left to drop the listed ones (they drop each other).
	Unattended string `json:"unattended,omitempty"`
	Checkpoint struct {
		Kind     string `json:"kind"`
		URL      string `json:"url"`
		Revision string `json:"revision"`
		Store    string `json:"store,omitempty"`    // s3://bucket/prefix elected trainers upload to
		Endpoint string `json:"endpoint,omitempty"` // the store's service (empty: AWS S3)
	} `json:"checkpoint"`
	Data *dataView `json:"data,omitempty"` // where the training tokens come from (datasource.go)
}

type clientView struct {
	Address string `json:"address"`
	P2P     string `json:"p2p"`
	State   string `json:"state"` // clientLabel
	Height  uint32 `json:"exited_height,omitempty"`
	// LastSeen, for a member of the epoch in its rounds: the latest of the
	// rounds the coordinator keeps in which it sent a witness report or a
	// witness had its result (nil: in none of them).
	LastSeen  *uint32 `json:"last_seen_round,omitempty"`
	seenKnown bool    // LastSeen applies (the member is in a round's epoch)
	// SitsOut, for a pending joiner the next epoch leaves out: that epoch
	// (a health check dropped it, at DroppedAt, in the one before).
	SitsOut   *uint32 `json:"sits_out_epoch,omitempty"`
	DroppedAt *uint32 `json:"dropped_at_round,omitempty"`
}

// waitingView is what a run in WaitingForMembers needs to start its next
// epoch: Needed joiners (init_min_clients), and then ExtraTime seconds
// (waiting_for_members_extra_time) since it began waiting.
type waitingView struct {
	Epoch     uint32 `json:"epoch"`
	Joined    int    `json:"joined"`
	Needed    uint16 `json:"needed"`
	SitOut    int    `json:"sitting_out"` // joiners the epoch leaves out (they count towards Needed)
	Waited    uint64 `json:"waited_seconds"`
	ExtraTime uint64 `json:"extra_time_seconds"`
}

// What `psyche status` calls a client besides the coordinator's removals
// (Dropped, Withdrawn, Ejected).
const (
	labelHealthy = "Healthy" // a member of the epoch in progress, in good standing
	labelPending = "Pending" // joined the next epoch, which has not started
	labelLeft    = "Left"    // stayed to the end of its epoch and is not in the run now
)

// clientLabel is what status shows for an entry of the epoch's Clients or
// Exited list. The coordinator keeps Healthy on the entries of an epoch that
// ended (they are its members until the next one starts, and are then copied
// to Exited), so Healthy there does not mean the client is still training:
// the label says where the client is now instead. An entry the coordinator
// removed keeps its removal, with the round in the record.
func clientLabel(s *coordinator.Coordinator, cl coordinator.Client) string {
	if cl.State != coordinator.Healthy {
		return cl.State.String()
	}
	if epochInProgress(s.RunState) {
		if i, ok := s.ClientIndex(cl.ID.Signer); ok {
			if m := s.Epoch.Clients[i]; m.State != coordinator.Healthy {
				return m.State.String()
			}
			return labelHealthy
		}
	}
	if _, ok := s.PendingIndex(cl.ID.Signer); ok {
		return labelPending
	}
	return labelLeft
}

// epochInProgress reports whether the run is in an epoch, whose Clients
// list is then its members (between epochs it is the last epoch's).
func epochInProgress(st coordinator.RunState) bool {
	switch st {
	case coordinator.Warmup, coordinator.RoundTrain, coordinator.RoundWitness, coordinator.Cooldown:
		return true
	}
	return false
}

type roundView struct {
	Height    uint32 `json:"height"`
	DataIndex uint64 `json:"data_index"`
	BatchSize uint16 `json:"batch_size"`
	Witnesses int    `json:"witnesses"`
	Of        uint16 `json:"witness_slots"`
}

// lastSeen is the latest round of the epoch's ring (its last
// coordinator.NumRounds rounds) in which member i was seen: it sent a
// witness report, or a witness had its result. ok false: in none of them.
func lastSeen(s *coordinator.Coordinator, i int) (height uint32, ok bool) {
	cur := s.CurrentRound()
	member := coordinator.ParticipantMember(s.Epoch.Clients[i].ID.Signer)
	for k := range s.Epoch.Rounds {
		r := &s.Epoch.Rounds[k]
		// A slot holding a later height is the last epoch's round.
		if r.Height > cur.Height || cur.Height-r.Height >= coordinator.NumRounds {
			continue
		}
		for _, w := range r.Witnesses[:r.WitnessesLen] {
			if (int(w.Proof.Index) == i || w.Participants.Has(w.Key, member)) && (!ok || r.Height > height) {
				height, ok = r.Height, true
			}
		}
	}
	return height, ok
}

// unattendedAfter is how long a round may go without a witness report
// before status says that no trainer may be left (a round's reports come
// within seconds of its start on a healthy run).
const unattendedAfter = 10 * time.Second

func viewOf(s *coordinator.Coordinator, now time.Time) statusView {
	v := statusView{RunID: s.RunIDString(), State: s.RunState.String(), StateSince: s.RunStateStart,
		Epoch: s.Progress.Epoch, Step: s.Progress.Step, Nonce: s.Nonce, PendingPause: s.PendingPause,
		Clients: []clientView{}, Pending: []string{}, Exited: []clientView{}}
	client := func(cl coordinator.Client) clientView {
		// The p2p id as libp2p, the logs and the explorer print it.
		return clientView{Address: cl.ID.Signer.String(), P2P: explorer.PeerID(cl.ID.P2P), State: clientLabel(s, cl), Height: cl.ExitedHeight}
	}
	inRounds := s.RunState == coordinator.RoundTrain || s.RunState == coordinator.RoundWitness
	for i, cl := range s.Epoch.Clients[:s.Epoch.ClientsLen] {
		c := client(cl)
		if inRounds && c.State == labelHealthy {
			c.seenKnown = true
			if h, ok := lastSeen(s, i); ok {
				c.LastSeen = &h
			}
		}
		v.Clients = append(v.Clients, c)
	}
	if r := s.CurrentRound(); inRounds && r.WitnessesLen == 0 && now.Unix()-int64(s.RunStateStart) >= int64(unattendedAfter/time.Second) {
		v.Unattended = fmt.Sprintf("nobody has reported in round %d for %s: if the trainers are gone, nobody is left to drop them (trainers drop each other); "+
			"the round ends at its limit (max_round_train_time %d s, then round_witness_time %d s) without a witness, and the epoch with it, withdrawing them",
			r.Height, (time.Duration(now.Unix()-int64(s.RunStateStart)) * time.Second).String(), s.Config.MaxRoundTrainTime, s.Config.RoundWitnessTime)
	}
	for _, cl := range s.Epoch.Exited[:s.Epoch.ExitedLen] {
		v.Exited = append(v.Exited, client(cl))
	}
	for _, id := range s.Pending[:s.PendingLen] {
		v.Pending = append(v.Pending, id.Signer.String())
	}
	v.Members = membersOf(s, v)
	if s.RunState == coordinator.WaitingForMembers {
		w := &waitingView{Epoch: s.Progress.Epoch, Joined: int(s.PendingLen), Needed: s.Config.InitMinClients,
			ExtraTime: s.Config.WaitingForMembersExtraTime}
		if now.Unix() > int64(s.RunStateStart) {
			w.Waited = uint64(now.Unix()) - s.RunStateStart
		}
		for _, m := range v.Members {
			if m.SitsOut != nil {
				w.SitOut++
			}
		}
		v.Waiting = w
	}
	if epochInProgress(s.RunState) {
		r := s.CurrentRound()
		v.Round = &roundView{Height: r.Height, DataIndex: r.DataIndex, BatchSize: s.RoundBatchSize(r),
			Witnesses: int(r.WitnessesLen), Of: s.Config.WitnessCount(r.ClientsLen)}
	}
	v.Checkpoint.Kind = s.Model.Checkpoint.Kind.String()
	v.Checkpoint.URL = coordinator.FixedString(s.Model.Checkpoint.Source.URL[:])
	v.Checkpoint.Store = coordinator.FixedString(s.Model.Store.URL[:])
	v.Checkpoint.Endpoint = coordinator.FixedString(s.Model.Store.Endpoint[:])
	v.Checkpoint.Revision = coordinator.FixedString(s.Model.Checkpoint.Source.Revision[:])
	return v
}

// membersOf lists each client of the run's lists once, in the order they
// first appear (the epoch's clients, the joiners, the exited), with its
// latest state: a member of the epoch in progress as it stands in it;
// else a joiner as Pending (with the epoch it sits out, if the next epoch
// leaves it out); else its entry in the last epoch's clients; else its
// last entry in the exited list, which holds the epoch before's members
// first and then this epoch's removals.
func membersOf(s *coordinator.Coordinator, v statusView) []clientView {
	latest := map[string]clientView{}
	for _, c := range v.Exited {
		latest[c.Address] = c
	}
	for _, c := range v.Clients {
		latest[c.Address] = c
	}
	for i, id := range s.Pending[:s.PendingLen] {
		addr := v.Pending[i]
		if j, ok := s.ClientIndex(id.Signer); ok && epochInProgress(s.RunState) && s.Epoch.Clients[j].State == coordinator.Healthy {
			continue // training now: that is its latest state
		}
		c := clientView{Address: addr, P2P: explorer.PeerID(id.P2P), State: labelPending}
		if s.SitsOut(id.Signer) {
			epoch := s.Progress.Epoch
			c.SitsOut = &epoch
			if prev, ok := latest[addr]; ok && prev.State == coordinator.Dropped.String() {
				h := prev.Height
				c.DroppedAt = &h
			}
		}
		latest[addr] = c
	}
	var out []clientView
	seen := map[string]bool{}
	add := func(addr string) {
		if !seen[addr] {
			seen[addr] = true
			out = append(out, latest[addr])
		}
	}
	for _, c := range v.Clients {
		add(c.Address)
	}
	for _, a := range v.Pending {
		add(a)
	}
	for _, c := range v.Exited {
		add(c.Address)
	}
	return out
}

func status(c *cli.Context) error {
	if c.Bool("history") {
		return printHistory(c)
	}
	b, _, err := backend(c, false)
	if err != nil {
		return err
	}
	snap, err := b.Snapshot(c.Context, c.String("run-id"))
	if err != nil {
		return err
	}
	v := viewOf(snap.State, time.Now())
	v.Data = dataViewOf(c.Context, snap.State, c.String("server"), len(c.StringSlice("rpc")) == 0)
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		if fed := federatedInfo(c); fed != nil {
			return enc.Encode(withFederated{v, fed})
		}
		return enc.Encode(v)
	}
	printStatus(c.App.Writer, v)
	if fed := federatedInfo(c); fed != nil {
		printFederated(c.App.Writer, fed)
	}
	return nil
}

func printStatus(w io.Writer, v statusView) {
	fmt.Fprintf(w, "run %s: %s since %s, epoch %d, step %d (nonce %d)\n", v.RunID, v.State,
		time.Unix(int64(v.StateSince), 0).UTC().Format(time.RFC3339), v.Epoch, v.Step, v.Nonce)
	if v.PendingPause {
		fmt.Fprintln(w, "a pause is pending: the run pauses when this epoch ends")
	}
	if v.Waiting != nil {
		fmt.Fprintln(w, waitingLine(v.Waiting))
	}
	if v.Round != nil {
		fmt.Fprintf(w, "round %d: data [%d, %d), witnesses %d/%d\n", v.Round.Height, v.Round.DataIndex,
			v.Round.DataIndex+uint64(v.Round.BatchSize), v.Round.Witnesses, v.Round.Of)
	}
	printData(w, v.Data)
	if v.Unattended != "" {
		fmt.Fprintln(w, v.Unattended)
	}
	fmt.Fprintf(w, "checkpoint: %s %s %s\n", v.Checkpoint.Kind, v.Checkpoint.URL, v.Checkpoint.Revision)
	if v.Checkpoint.Store != "" {
		at := v.Checkpoint.Endpoint
		if at == "" {
			at = "AWS S3"
		}
		fmt.Fprintf(w, "checkpoint store: %s at %s\n", v.Checkpoint.Store, at)
	}
	// Addresses are 32-44 characters: the column is as wide as the longest.
	width := 0
	for _, cl := range v.Members {
		width = max(width, len(cl.Address))
	}
	fmt.Fprintf(w, "members (%d):\n", len(v.Members))
	for _, cl := range v.Members {
		fmt.Fprintf(w, "  %-*s %s\n", width, cl.Address, clientStatus(cl, v.Round))
	}
}

// waitingLine says what a run waiting for members needs to start its next
// epoch and how long it has waited.
func waitingLine(w *waitingView) string {
	waited := (time.Duration(w.Waited) * time.Second).String()
	sitting := ""
	switch {
	case w.SitOut == 1:
		sitting = " (1 of them sits the epoch out, below, and counts towards it)"
	case w.SitOut > 1:
		sitting = fmt.Sprintf(" (%d of them sit the epoch out, below, and count towards it)", w.SitOut)
	}
	if w.Joined < int(w.Needed) {
		return fmt.Sprintf("waiting for members for %s: %d of the %d needed to start epoch %d have joined%s (init_min_clients); it starts %d s after the last of them joins",
			waited, w.Joined, w.Needed, w.Epoch, sitting, w.ExtraTime)
	}
	return fmt.Sprintf("waiting for members for %s: %d joined, %d needed%s: epoch %d starts once the run has waited %d s (waiting_for_members_extra_time)",
		waited, w.Joined, w.Needed, sitting, w.Epoch, w.ExtraTime)
}

// clientStatus is a client's label, with the round of a removal, and for
// a member in the epoch's rounds (round: the current one) when it was last
// seen.
func clientStatus(cl clientView, round *roundView) string {
	switch cl.State {
	case labelHealthy:
		switch {
		case !cl.seenKnown || round == nil:
			return cl.State
		case cl.LastSeen == nil:
			return fmt.Sprintf("%s, not seen in the last %d rounds", cl.State, min(round.Height+1, coordinator.NumRounds))
		case *cl.LastSeen == round.Height:
			return cl.State + ", seen in this round"
		default:
			return fmt.Sprintf("%s, last seen in round %d", cl.State, *cl.LastSeen)
		}
	case labelPending:
		if cl.SitsOut == nil {
			return cl.State
		}
		why := "a health check dropped it in the epoch before"
		if cl.DroppedAt != nil {
			why = fmt.Sprintf("a health check dropped it at round %d of the epoch before", *cl.DroppedAt)
		}
		return fmt.Sprintf("%s, sits out epoch %d: %s, and the run has min_clients without it; it may join epoch %d",
			cl.State, *cl.SitsOut, why, *cl.SitsOut+1)
	case labelLeft:
		return cl.State
	}
	return fmt.Sprintf("%s at round %d", cl.State, cl.Height)
}

// printHistory copies the run's history CSV from the explorer (the
// server's own, by default) to stdout.
func printHistory(c *cli.Context) error {
	base := c.String("explorer")
	if base == "" {
		if len(c.StringSlice("rpc")) > 0 {
			return errors.New("--history: a Solana run's history is kept by a psyche explorer: pass its URL with --explorer")
		}
		base = c.String("server")
	}
	u := strings.TrimRight(base, "/") + "/api/runs/" + url.PathEscape(c.String("run-id")) + "/history.csv"
	req, err := http.NewRequestWithContext(c.Context, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("--history: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("--history: %s answered %s: %s", u, resp.Status, strings.TrimSpace(string(b)))
	}
	_, err = io.Copy(c.App.Writer, resp.Body)
	return err
}
