package main

import (
	"io"
	"sync"
)

// statusLine keeps one live status line at the bottom of a terminal. Log
// lines written through LogWriter appear above it: the line is cleared, the
// log line written, and the status drawn again, so the two never share a
// line.
type statusLine struct {
	mu   sync.Mutex
	term io.Writer // the terminal the status is drawn on
	text string
}

// clearLine returns the cursor to the line's start and erases the line
// (carriage return, then ANSI "erase in line").
const clearLine = "\r\x1b[K"

// Set replaces the status text.
func (s *statusLine) Set(text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.text = text
	_, _ = io.WriteString(s.term, clearLine+text)
}

// Done ends the status line, leaving its last text on screen.
func (s *statusLine) Done() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.text != "" {
		_, _ = io.WriteString(s.term, "\n")
		s.text = ""
	}
}

// LogWriter wraps w (the log's destination, on the same terminal) so that
// every write lands above the status line.
func (s *statusLine) LogWriter(w io.Writer) io.Writer { return statusLogWriter{s, w} }

type statusLogWriter struct {
	s *statusLine
	w io.Writer
}

func (l statusLogWriter) Write(p []byte) (int, error) {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.s.text != "" {
		_, _ = io.WriteString(l.s.term, clearLine)
	}
	n, err := l.w.Write(p)
	if l.s.text != "" {
		_, _ = io.WriteString(l.s.term, l.s.text)
	}
	return n, err
}
