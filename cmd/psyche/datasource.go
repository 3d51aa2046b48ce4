package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/psyche-go/psyche/chain"
	"github.com/psyche-go/psyche/coordinator"
	"github.com/psyche-go/psyche/trainer/data"
	"github.com/urfave/cli/v2"
)

// dataDirFlag is psyche server's --data.
var dataDirFlag = &cli.StringFlag{Name: "data", Usage: "serve the token files under this directory read-only at /data/ (range requests), for runs whose data is \"server:PATH\" (PATH relative to it); it may not overlap --dir", Category: "SERVER"}

// dataKind is the coordinator's kind of a data location: a file every
// trainer has (a path, file://, a built-in corpus), or one read remotely
// with range requests (http(s), the server's, a bucket's).
func dataKind(location string) coordinator.DataKind {
	if _, ok, _ := data.ServerPath(location); ok {
		return coordinator.DataHTTP
	}
	scheme, _, _ := strings.Cut(strings.ToLower(location), "://")
	switch scheme {
	case "http", "https", "s3":
		return coordinator.DataHTTP
	}
	return coordinator.DataLocal
}

// dataView is where a run's data comes from, as psyche status shows it.
type dataView struct {
	Location string `json:"location"`           // as the run file writes it
	Source   string `json:"source"`             // data.Describe
	URL      string `json:"url,omitempty"`      // what a trainer of this backend fetches (server: and http(s) data)
	Endpoint string `json:"endpoint,omitempty"` // s3:// data: the run's store endpoint it is read from
	Bytes    int64  `json:"bytes,omitempty"`    // the file's size, when it could be asked
	Error    string `json:"error,omitempty"`    // why the size could not be asked
}

// dataProbeTimeout bounds psyche status's one request for the data's size.
const dataProbeTimeout = 5 * time.Second

// dataViewOf describes a run's data. A server: file (on the server
// backend, at serverURL) and an http(s) file are asked for their size with
// one ranged GET, as a trainer asks; an s3:// object is not (the
// credentials are each trainer's).
func dataViewOf(ctx context.Context, s *coordinator.Coordinator, serverURL string, onServer bool) *dataView {
	loc := coordinator.FixedString(s.Model.DataLocation[:])
	if loc == "" {
		return nil
	}
	v := &dataView{Location: loc, Source: data.Describe(loc)}
	fetch := ""
	if p, ok, err := data.ServerPath(loc); ok {
		switch {
		case err != nil:
			v.Error = err.Error()
		case !onServer:
			v.Error = "a server: location needs the server backend; this run is on Solana"
		default:
			if fetch, err = data.ServerDataURL(serverURL, p); err != nil {
				v.Error = err.Error()
			}
		}
	} else if scheme, _, _ := strings.Cut(strings.ToLower(loc), "://"); scheme == "http" || scheme == "https" {
		fetch = loc
	} else if scheme == "s3" {
		v.Endpoint = coordinator.FixedString(s.Model.Store.Endpoint[:])
		if v.Endpoint == "" {
			v.Endpoint = "AWS S3"
		}
	}
	if fetch == "" {
		return v
	}
	src, err := data.NewHTTPSource(fetch, data.WithRetries(0), data.WithRequestTimeout(dataProbeTimeout))
	if err != nil {
		v.Error = err.Error()
		return v
	}
	v.URL = src.String()
	if n, err := src.Size(ctx); err != nil {
		v.Error = err.Error()
	} else {
		v.Bytes = n
	}
	return v
}

// printData writes psyche status's data line.
func printData(w io.Writer, v *dataView) {
	if v == nil {
		return
	}
	var detail []string
	if v.Bytes > 0 {
		detail = append(detail, megabytes(v.Bytes))
	}
	if v.URL != "" && v.URL != v.Source {
		detail = append(detail, "at "+v.URL)
	}
	if v.Endpoint != "" {
		detail = append(detail, "through the run's store endpoint "+v.Endpoint)
	}
	if v.Error != "" {
		detail = append(detail, "unreadable from here: "+v.Error)
	}
	if len(detail) == 0 {
		fmt.Fprintf(w, "data: %s\n", v.Source)
		return
	}
	fmt.Fprintf(w, "data: %s (%s)\n", v.Source, strings.Join(detail, ", "))
}

// megabytes is n bytes for people: "12.3 MB", "512 bytes".
func megabytes(n int64) string {
	if n < 100_000 {
		return fmt.Sprintf("%d bytes", n)
	}
	return fmt.Sprintf("%.1f MB", float64(n)/1e6)
}

// printDataServed says where psyche server serves its --data directory.
func printDataServed(w io.Writer, dir, addr string) {
	if dir == "" {
		return
	}
	fmt.Fprintf(w, "data: %s served read-only at http://%s%s (a run names a file under it as data = \"%sPATH\")\n",
		dir, addr, chain.ServerDataPath, data.ServerPrefix)
}
