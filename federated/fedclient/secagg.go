package fedclient

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/psyche-go/psyche/federated"
	"github.com/psyche-go/psyche/federated/secagg"
)

// ErrAborted means the server gave up a secure aggregation round (too few
// clients answered in time, or it restarted): train on the current model
// and start again.
var ErrAborted = errors.New("fedclient: secure aggregation round aborted")

// SecAggHooks lets tests stop a client mid-round (a dropout).
type SecAggHooks struct {
	// AfterShares, if set, is called once the client's shares are sent; an
	// error ends the round there (the client vanishes).
	AfterShares func() error
}

func (c *Client) secaggPost(ctx context.Context, kind federated.Kind, payload []byte) (*secagg.View, int, error) {
	var v secagg.View
	n, err := c.post(ctx, kind, payload, &v)
	if err != nil {
		return nil, n, err
	}
	return &v, n, nil
}

// secaggWait waits for round base's phase (keys, inbox, survivors, done).
func (c *Client) secaggWait(ctx context.Context, base uint64, phase string, id secagg.ID) (*secagg.View, error) {
	for {
		u := c.base + "/v1/runs/" + url.PathEscape(c.run) + "/federated/secagg?base=" + strconv.FormatUint(base, 10) +
			"&phase=" + phase + "&id=" + strconv.Itoa(int(id))
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		resp, err := c.http.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode == http.StatusNoContent {
			resp.Body.Close()
			continue
		}
		if resp.StatusCode != http.StatusOK {
			err := decodeFailure(resp)
			resp.Body.Close()
			return nil, err
		}
		var v secagg.View
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("fedclient: secagg %s: %w", phase, err)
		}
		return &v, nil
	}
}

// SecAggRound takes part in round base's secure aggregation with update
// delta (clipped to clip), the run's threshold and masking graph degree:
// it returns the bytes it sent.
func (c *Client) SecAggRound(ctx context.Context, base uint64, delta []float32, clip float32, threshold, neighbors int, hooks SecAggHooks) (int, error) {
	var seed [32]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return 0, err
	}
	// The keys depend on the seed only: advertise them under a provisional
	// id, then play the round under the id the server assigns.
	pre, err := secagg.NewClient(1, threshold, neighbors, seed)
	if err != nil {
		return 0, err
	}
	k := pre.Advertise()
	sent := 0
	v, n, err := c.secaggPost(ctx, federated.KindSecAggAdvertise, secagg.EncodeAdvertisement(&secagg.Advertisement{Base: base, C: k.C, S: k.S}))
	sent += n
	if err != nil {
		return sent, err
	}
	me, f := v.ID, v.FractionBits
	sc, err := secagg.NewClient(me, threshold, neighbors, seed)
	if err != nil {
		return sent, err
	}
	x, err := secagg.Encode(delta, float64(clip), f)
	if err != nil {
		return sent, err
	}
	keys, err := c.secaggWait(ctx, base, "keys", me)
	if err != nil {
		return sent, err
	}
	cts, err := sc.Share(keys.Keys)
	if err != nil {
		return sent, err
	}
	if _, n, err = c.secaggPost(ctx, federated.KindSecAggShares, secagg.EncodeShares(base, me, cts)); err != nil {
		return sent + n, err
	}
	sent += n
	if hooks.AfterShares != nil {
		if err := hooks.AfterShares(); err != nil {
			return sent, err
		}
	}
	inbox, err := c.secaggWait(ctx, base, "inbox", me)
	if err != nil {
		return sent, err
	}
	y, err := sc.Mask(x, inbox.Inbox)
	if err != nil {
		return sent, err
	}
	if _, n, err = c.secaggPost(ctx, federated.KindSecAggMasked, secagg.EncodeMasked(base, me, y)); err != nil {
		return sent + n, err
	}
	sent += n
	surv, err := c.secaggWait(ctx, base, "survivors", me)
	if err != nil {
		return sent, err
	}
	rv, err := sc.Unmask(surv.Survivors)
	if err != nil {
		return sent, err
	}
	_, n, err = c.secaggPost(ctx, federated.KindSecAggReveal, secagg.EncodeReveal(base, rv))
	return sent + n, err
}
