package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/explorer"
	"github.com/urfave/cli/v2"
)

// statusView is what `psyche status --json` prints.
type statusView struct {
	RunID        string       `json:"run_id"`
	State        string       `json:"state"`
	StateSince   uint64       `json:"state_since"`
	Epoch        uint32       `json:"epoch"`
	Step         uint32       `json:"step"`
	Nonce        uint64       `json:"nonce"`
	PendingPause bool         `json:"pending_pause"`
	Clients      []clientView `json:"clients"`
	Pending      []string     `json:"pending"`
	Exited       []clientView `json:"exited"`
	Round        *roundView   `json:"round,omitempty"`
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
	// There is a round only while an epoch is in progress; otherwise the
	// clients are those of the epoch that ended.
	if v.Round == nil && len(v.Clients) > 0 {
		fmt.Fprintf(w, "clients of the last epoch (%d):\n", len(v.Clients))
	} else {
		fmt.Fprintf(w, "clients (%d):\n", len(v.Clients))
	}
	// Addresses are 32-44 characters: the column is as wide as the longest.
	width := 0
	for _, cl := range slices.Concat(v.Clients, v.Exited) {
		width = max(width, len(cl.Address))
	}
	for _, cl := range v.Clients {
		fmt.Fprintf(w, "  %-*s %s\n", width, cl.Address, clientStatus(cl, v.Round))
	}
	if len(v.Pending) > 0 {
		fmt.Fprintf(w, "pending for the next epoch (%d):\n", len(v.Pending))
		for _, p := range v.Pending {
			fmt.Fprintf(w, "  %s\n", p)
		}
	}
	if len(v.Exited) > 0 {
		// The coordinator's Exited list: the members of the epoch before
		// this one and the clients removed during this one. Its labels say
		// where each is now (a member who stayed on is Healthy above too).
		fmt.Fprintf(w, "last epoch's members and this epoch's removals (%d):\n", len(v.Exited))
		for _, cl := range v.Exited {
			fmt.Fprintf(w, "  %-*s %s\n", width, cl.Address, clientStatus(cl, nil))
		}
	}
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
	case labelPending, labelLeft:
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
