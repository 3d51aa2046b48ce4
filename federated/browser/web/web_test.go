package web

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// TestTrainPageHeaders: the page and every file it loads carry a
// Content-Security-Policy (with 'wasm-unsafe-eval', which compiling the
// module in the worker needs: a worker's policy is its script's), nosniff,
// and frame-ancestors 'none'; they carried none (the explorer's page did).
func TestTrainPageHeaders(t *testing.T) {
	mux := http.NewServeMux()
	Routes(mux)
	for _, path := range []string{"/train/some-run", "/train/static/app.js", "/train/static/worker.js", "/train/static/style.css",
		"/train/static/wasm_exec.js", "/train/static/psyche.wasm", "/train/static/nothing-here.js"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		h := rec.Result().Header
		csp := h.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'self'", "script-src 'self' 'wasm-unsafe-eval'", "frame-ancestors 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("%s (%d): Content-Security-Policy %q lacks %q", path, rec.Code, csp, want)
			}
		}
		if strings.Contains(csp, "'unsafe-eval'") || strings.Contains(csp, "*") {
			t.Errorf("%s: Content-Security-Policy %q allows more than the page needs", path, csp)
		}
		if got := h.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("%s: X-Content-Type-Options %q, want nosniff", path, got)
		}
		if got := h.Get("X-Frame-Options"); got != "DENY" {
			t.Errorf("%s: X-Frame-Options %q, want DENY", path, got)
		}
	}
}

// TestTrainPageFitsItsPolicy: what the page loads is what CSP allows: its
// scripts, styles and worker from the server itself, no inline script or
// handler, no other origin, and data: only for the icon (img-src).
func TestTrainPageFitsItsPolicy(t *testing.T) {
	html, err := files.ReadFile("static/index.html")
	if err != nil {
		t.Fatal(err)
	}
	page := string(html)
	if regexp.MustCompile(`<script(?:\s[^>]*)?>\s*[^<\s]`).MatchString(page) || regexp.MustCompile(`\son[a-z]+=`).MatchString(page) {
		t.Error("the page has an inline script or event handler, which script-src 'self' refuses")
	}
	for _, m := range regexp.MustCompile(`(?:src|href)="([^"]*)"`).FindAllStringSubmatch(page, -1) {
		if u := m[1]; !strings.HasPrefix(u, "/train/static/") && u != "data:," {
			t.Errorf("the page loads %q: not the server's own", u)
		}
	}
	for _, name := range []string{"static/app.js", "static/worker.js"} {
		b, err := files.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		src := string(b)
		for _, bad := range []string{"eval(", "new Function", "http://", "https://", "blob:"} {
			if strings.Contains(src, bad) {
				t.Errorf("%s uses %q, which the page's policy refuses", name, bad)
			}
		}
	}
}
