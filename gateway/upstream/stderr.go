package upstream

import (
	"bytes"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"
)

// A stdio upstream's stderr is logged one record per line, within bounds:
// a child that writes without pause must neither fill the operator's disk
// or log pipeline nor keep Countersign busy formatting records. The child
// is never slowed down: its stderr is read as fast as it writes, and what
// is over the bounds is dropped, counted, and summarized.
const (
	// maxStderrLine caps a logged line: a longer one is logged cut there,
	// with stderrCut appended, and the rest of it is dropped.
	maxStderrLine = 8 << 10
	stderrCut     = " … [truncated]"

	// An upstream logs at most stderrLinesPerSec lines and
	// stderrBytesPerSec bytes (of the lines as logged) a second, and at
	// most stderrLineBurst lines and stderrByteBurst bytes at once: two
	// token buckets, full at Start and shared by the upstream's
	// successive children.
	stderrLinesPerSec = 20
	stderrBytesPerSec = 16 << 10
	stderrLineBurst   = 200
	stderrByteBurst   = 128 << 10
)

// stderrLimit is an upstream's budget for logging its children's stderr:
// the two token buckets, and what was dropped since the last summary. The
// summary, a record "upstream stderr dropped" with the lines and their
// bytes, is logged once every has passed since the first drop it counts,
// or when a child's stderr ends (lineLogger.flush), if sooner.
type stderrLimit struct {
	log   *slog.Logger
	every time.Duration // stderrReportEvery, as Start found it

	mu           sync.Mutex
	lines, bytes float64   // tokens
	at           time.Time // when the tokens were last counted
	droppedLines int
	droppedBytes int
	report       *time.Timer // set while drops await their summary
}

func newStderrLimit(log *slog.Logger, every time.Duration) *stderrLimit {
	return &stderrLimit{log: log, every: every, lines: stderrLineBurst, bytes: stderrByteBurst, at: time.Now()}
}

// logLine logs line (cut, if it was cut at maxStderrLine) if the buckets
// hold the tokens for it; else it counts it as dropped. It reports whether
// the line was logged.
func (l *stderrLimit) logLine(line []byte, cut bool, now time.Time) bool {
	size := len(line)
	if cut {
		size += len(stderrCut)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if d := now.Sub(l.at).Seconds(); d > 0 {
		l.lines = min(stderrLineBurst, l.lines+d*stderrLinesPerSec)
		l.bytes = min(stderrByteBurst, l.bytes+d*stderrBytesPerSec)
		l.at = now
	}
	if l.lines < 1 || l.bytes < float64(size) {
		l.dropLocked(1, len(line))
		return false
	}
	l.lines--
	l.bytes -= float64(size)
	text := string(line)
	if cut {
		text += stderrCut
	}
	l.log.Info("upstream stderr", "line", text)
	return true
}

// drop counts n more bytes of a line already dropped.
func (l *stderrLimit) drop(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropLocked(0, n)
}

func (l *stderrLimit) dropLocked(lines, n int) {
	l.droppedLines += lines
	l.droppedBytes += n
	if l.report == nil {
		l.report = time.AfterFunc(l.every, l.summarize)
	}
}

// summarize logs what was dropped since the last summary, if anything.
func (l *stderrLimit) summarize() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.report != nil {
		l.report.Stop()
		l.report = nil
	}
	if l.droppedLines == 0 && l.droppedBytes == 0 {
		return
	}
	l.log.Warn("upstream stderr dropped", "lines", l.droppedLines, "bytes", l.droppedBytes)
	l.droppedLines, l.droppedBytes = 0, 0
}

// lineLogger logs what one child writes to stderr, one record per line
// (without its line feed, and a carriage return before it), within lim. It
// never blocks on the budget: a line over it is dropped.
type lineLogger struct {
	lim *stderrLimit
	mu  sync.Mutex
	buf []byte // the line so far, up to maxStderrLine bytes
	// skip is set in a line cut at maxStderrLine, whose rest is dropped;
	// skipCounts if the line was dropped whole, so its rest is counted.
	skip, skipCounts bool
}

func (w *lineLogger) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, now := len(p), time.Now()
	for len(p) > 0 {
		end := bytes.IndexByte(p, '\n')
		if end < 0 {
			end = len(p)
		}
		switch {
		case w.skip:
			if w.skipCounts {
				w.lim.drop(end)
			}
			w.skip = end == len(p)
		case len(w.buf)+end <= maxStderrLine:
			w.buf = append(w.buf, p[:end]...)
			if end < len(p) {
				w.emit(false, now)
			}
		default:
			end = maxStderrLine - len(w.buf)
			w.buf = append(w.buf, p[:end]...)
			w.skip, w.skipCounts = true, !w.emit(true, now)
			p = p[end:]
			continue
		}
		p = p[min(end+1, len(p)):]
	}
	return n, nil
}

// emit logs the line in buf, unless it is empty, and empties buf. It
// reports false if the line was dropped.
func (w *lineLogger) emit(cut bool, now time.Time) bool {
	line := w.buf
	if !cut {
		line = bytes.TrimRight(line, "\r")
	} else {
		line = cutAtCharacter(line)
	}
	w.buf = w.buf[:0]
	if len(line) == 0 {
		return true
	}
	return w.lim.logLine(line, cut, now)
}

// flush logs a last line without a line feed, and summarizes what was
// dropped. It is called once the child's stderr is drained.
func (w *lineLogger) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.skip {
		w.emit(false, time.Now())
	}
	w.buf, w.skip = nil, false
	w.lim.summarize()
}

// cutAtCharacter drops from line the start of a UTF-8 character that the
// cut at maxStderrLine split (a log would show it as U+FFFD). Bytes that
// are not UTF-8 anyway are left as they are.
func cutAtCharacter(line []byte) []byte {
	for i := len(line) - 1; i >= max(0, len(line)-utf8.UTFMax); i-- {
		if utf8.RuneStart(line[i]) {
			if !utf8.FullRune(line[i:]) {
				return line[:i]
			}
			break
		}
	}
	return line
}
