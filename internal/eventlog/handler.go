package eventlog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// HandlerConfig is one <logfile> section.
type HandlerConfig struct {
	// Path is the file, or STDOUT or STDERR for those streams.
	Path string
	// Level drops the records below it (NotSet: none).
	Level Level
	// Format is the record format, unescaped ("" means DefaultFormat).
	Format string
	// DateFormat is the strftime format of %(asctime)s ("" means
	// DefaultDateFormat).
	DateFormat string
	// MaxSize, when not 0, rotates the file when a record would make it
	// reach MaxSize bytes: path.1 becomes path.2 and so on up to
	// path.OldFiles, path becomes path.1, and a new path is started
	// (Python's RotatingFileHandler). OldFiles must then be positive.
	MaxSize  int64
	OldFiles int
	// Delay opens the file at the first record instead of at once.
	Delay bool
}

// IsStream reports whether the handler writes to standard output or error.
func (c *HandlerConfig) IsStream() bool { return c.Path == "STDOUT" || c.Path == "STDERR" }

// Check reports what ZConfig or Python's logging would refuse in c: a bad
// format or date format, rotation or delay on a standard stream, rotation
// without old files or old files without a size.
func (c *HandlerConfig) Check() error {
	_, _, err := c.compile()
	return err
}

func (c *HandlerConfig) compile() (*Format, *DateFormat, error) {
	if c.Path == "" {
		return nil, nil, errors.New("a log handler needs a path")
	}
	fs := c.Format
	if fs == "" {
		fs = UnescapeFormat(DefaultFormat)
	}
	f, err := ParseFormat(fs)
	if err != nil {
		return nil, nil, err
	}
	ds := c.DateFormat
	if ds == "" {
		ds = DefaultDateFormat
	}
	d, err := ParseDateFormat(ds)
	if err != nil {
		return nil, nil, err
	}
	if c.MaxSize < 0 || c.OldFiles < 0 {
		return nil, nil, errors.New("max-size and old-files cannot be negative")
	}
	if c.IsStream() {
		if c.MaxSize != 0 || c.OldFiles != 0 {
			return nil, nil, fmt.Errorf("cannot rotate %s", c.Path)
		}
		if c.Delay {
			return nil, nil, fmt.Errorf("cannot delay opening %s", c.Path)
		}
	} else if c.MaxSize != 0 || c.OldFiles != 0 {
		if c.OldFiles == 0 {
			return nil, nil, errors.New("old-files must be set for log rotation")
		}
		if c.MaxSize == 0 {
			return nil, nil, errors.New("max-size must be set for log rotation (old-files alone rotates nothing)")
		}
	}
	return f, d, nil
}

// Handler writes the records at or above its level to its output.
type Handler struct {
	level  Level
	format *Format
	date   *DateFormat

	mu      sync.Mutex
	buf     []byte
	w       io.Writer // the stream, or the open file; nil while a file is closed
	file    *fileOut  // nil for a stream or writer
	failing string    // the write error last reported, "" while writes succeed
}

// fileOut is a handler's file: its path, rotation settings and size.
type fileOut struct {
	path     string
	f        *os.File
	size     int64
	maxSize  int64
	oldFiles int
	delay    bool
	regular  bool  // the open file is a regular file: the only kind rotated
	retryAt  int64 // after a failed rotation, the size at which to try again
}

// NewHandler opens the output of c (unless c.Delay).
func NewHandler(c HandlerConfig) (*Handler, error) {
	f, d, err := c.compile()
	if err != nil {
		return nil, err
	}
	h := &Handler{level: c.Level, format: f, date: d}
	switch c.Path {
	case "STDOUT":
		h.w = os.Stdout
	case "STDERR":
		h.w = os.Stderr
	default:
		h.file = &fileOut{path: c.Path, maxSize: c.MaxSize, oldFiles: c.OldFiles, delay: c.Delay}
		if !c.Delay {
			if err := h.file.open(); err != nil {
				return nil, err
			}
			h.w = h.file.f
		}
	}
	return h, nil
}

// NewWriterHandler returns a handler writing to w with the format and date
// format given (unescaped; "" for the defaults).
func NewWriterHandler(w io.Writer, level Level, format, dateFormat string) (*Handler, error) {
	c := HandlerConfig{Path: "writer", Level: level, Format: format, DateFormat: dateFormat}
	f, d, err := c.compile()
	if err != nil {
		return nil, err
	}
	return &Handler{level: level, format: f, date: d, w: w}, nil
}

func (o *fileOut) open() error {
	f, err := os.OpenFile(o.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	o.f, o.size, o.regular, o.retryAt = f, st.Size(), st.Mode().IsRegular(), 0
	return nil
}

// emit writes r. A write error is reported on standard error, as Python's
// logging does, and the record is lost; the report is made once while the
// same error goes on (a full disk, a closed pipe), not once per record.
func (h *Handler) emit(r *Record) {
	if r.Level < h.level {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.buf = h.format.Append(h.buf[:0], r, h.date)
	h.buf = append(h.buf, '\n')
	var err error
	if h.file != nil {
		err = h.writeFile(h.buf)
	} else {
		_, err = h.w.Write(h.buf)
	}
	switch {
	case err != nil && err.Error() != h.failing:
		h.failing = err.Error()
		fmt.Fprintf(os.Stderr, "--- Logging error ---\n%v (reported once while it lasts)\n", err)
	case err == nil && h.failing != "":
		h.failing = ""
		fmt.Fprintf(os.Stderr, "--- Logging error ---\nwriting the log works again\n")
	}
	if cap(h.buf) > 64<<10 {
		h.buf = nil
	}
}

func (h *Handler) writeFile(b []byte) error {
	o := h.file
	if o.f == nil {
		if err := o.open(); err != nil {
			return err
		}
	}
	var rerr error
	if o.maxSize > 0 && o.regular {
		// The file's own size, as Python's handler takes it: another
		// program may have truncated it (logrotate's copytruncate).
		if end, err := o.f.Seek(0, io.SeekEnd); err == nil {
			o.size = end
		}
		if o.size > 0 && o.size+int64(len(b)) >= o.maxSize && o.size >= o.retryAt {
			rerr = o.rotate()
		}
	}
	n, err := o.f.Write(b)
	o.size += int64(n)
	if err == nil {
		err = rerr
	}
	return err
}

// rotate shifts path.N-1 to path.N ... path to path.1 (the oldest beyond
// oldFiles is overwritten) and opens a new path. The file is renamed
// before it is closed: when a rename fails, the records go on into the
// current file (none lost), and the rotation is tried again once it grew
// by another maxSize.
func (o *fileOut) rotate() error {
	fail := func(err error) error {
		o.retryAt = o.size + o.maxSize
		return fmt.Errorf("rotating %s: %w (writing on to it)", o.path, err)
	}
	for i := o.oldFiles - 1; i >= 1; i-- {
		src := fmt.Sprintf("%s.%d", o.path, i)
		if _, err := os.Stat(src); err == nil {
			if err := os.Rename(src, fmt.Sprintf("%s.%d", o.path, i+1)); err != nil {
				return fail(err)
			}
		}
	}
	if err := os.Rename(o.path, o.path+".1"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fail(err)
	}
	old := o.f
	if err := o.open(); err != nil {
		return fail(err) // o.f is still the renamed file: on into it
	}
	old.Close()
	return nil
}

// reopen reopens a file output (after logrotate moved it), as ZConfig's
// handlers do on runzeo's SIGUSR2: a rotating one (max-size) rotates; a
// delayed one is closed until its next record; another is opened anew
// before the old file is closed (if the open fails, the records go on
// into the old one).
func (h *Handler) reopen() error {
	if h.file == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	o := h.file
	switch {
	case o.f == nil:
		if o.delay {
			return nil
		}
	case o.delay:
		o.f.Close()
		o.f = nil
		return nil
	case o.maxSize > 0 && o.regular:
		if err := o.rotate(); err != nil {
			return fmt.Errorf("reopen %s: %w", o.path, err)
		}
		return nil
	}
	old := o.f
	if err := o.open(); err != nil {
		return fmt.Errorf("reopen %s: %w", o.path, err) // o.f is still the old file
	}
	if old != nil {
		old.Close()
	}
	return nil
}

func (h *Handler) close() error {
	if h.file == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.file.f == nil {
		return nil
	}
	err := h.file.f.Close()
	h.file.f = nil
	return err
}

// Logger is the root logger: records below its level are dropped, the
// others go to every handler (each with its own level).
type Logger struct {
	level    Level
	handlers []*Handler
	start    time.Time
}

// New returns a logger with the level and handlers; without handlers it
// logs nothing (as Python's root logger with ZConfig's NullHandler).
func New(level Level, handlers ...*Handler) *Logger {
	return &Logger{level: level, handlers: handlers, start: time.Now()}
}

// Enabled reports whether a record at lv would be written anywhere. A nil
// logger is never enabled.
func (l *Logger) Enabled(lv Level) bool {
	if l == nil || lv < l.level {
		return false
	}
	for _, h := range l.handlers {
		if lv >= h.level {
			return true
		}
	}
	return false
}

// Log writes a record of the named logger at level lv.
func (l *Logger) Log(lv Level, name, msg string) {
	if !l.Enabled(lv) {
		return
	}
	r := Record{Time: time.Now(), Level: lv, Name: name, Message: msg, start: l.start}
	for _, h := range l.handlers {
		h.emit(&r)
	}
}

// Logf is Log with a fmt format; the arguments are not formatted when no
// handler would write the record.
func (l *Logger) Logf(lv Level, name, format string, args ...any) {
	if !l.Enabled(lv) {
		return
	}
	l.Log(lv, name, fmt.Sprintf(format, args...))
}

// Reopen reopens every file (for logrotate: SIGHUP, SIGUSR2).
func (l *Logger) Reopen() error {
	if l == nil {
		return nil
	}
	var errs []error
	for _, h := range l.handlers {
		errs = append(errs, h.reopen())
	}
	return errors.Join(errs...)
}

// Close closes the files.
func (l *Logger) Close() error {
	if l == nil {
		return nil
	}
	var errs []error
	for _, h := range l.handlers {
		errs = append(errs, h.close())
	}
	return errors.Join(errs...)
}

// Writer returns an io.Writer whose every line is a record of the named
// logger at level lv (for the standard library's log package).
func (l *Logger) Writer(lv Level, name string) io.Writer {
	return lineWriter{l, lv, name}
}

type lineWriter struct {
	l    *Logger
	lv   Level
	name string
}

func (w lineWriter) Write(b []byte) (int, error) {
	w.l.Log(w.lv, w.name, strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
