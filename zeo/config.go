package zeo

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/zodbd/zodbd/internal/busypoll"
)

// FileConfig is what a runzeo configuration file (zeo.conf, ZConfig
// syntax) says, as far as zodbd uses it. Parsing does not open anything.
type FileConfig struct {
	Address               string // <zeo> address
	ReadOnly              bool
	InvalidationQueueSize int
	InvalidationAge       float64
	TransactionTimeout    time.Duration
	PidFile               string
	// Msgpack is nil when the file does not say (then $ZEO_MSGPACK decides).
	Msgpack                  *bool
	ClientConflictResolution bool
	// BusyPoll is zodbd's busy-poll key as written ("" when absent):
	// "off", "on" or a duration; zodbd serve parses it as its --busy-poll.
	BusyPoll string
	// HTTPAddr is zodbd's http-addr key ("" when absent): the HOST:PORT
	// where zodbd serve serves its metrics (/metrics, /live, /ready), as
	// its --http-addr. Checked by CheckHTTPAddr when parsed.
	HTTPAddr string
	SSL      *SSLConfig
	Storages []FileStorageConfig
	// EventLog is the <eventlog> section, nil when there is none (then
	// runzeo logs to standard error at level INFO).
	EventLog *EventLogConfig
}

// SSLConfig is the <ssl> section of <zeo>.
type SSLConfig struct {
	Certificate  string
	Key          string
	Authenticate string // CA file or directory for client certificates, or DYNAMIC
}

// FileStorageConfig is one <filestorage NAME> section, with what the
// sections around it add: <blobstorage> a blob directory, zc.zlibstorage's
// <zlibstorage> or <serverzlibstorage> the compression of records.
type FileStorageConfig struct {
	Name    string
	Path    string
	BlobDir string
	// BlobWrapper: BlobDir is a <blobstorage>'s, around the storage
	// (ZODB's BlobStorage, which create does not empty), not the
	// <filestorage>'s blob-dir (emptied by create, as FileStorage does).
	BlobWrapper bool
	Create      bool
	ReadOnly    bool
	Quota       int64
	PackGC      bool
	PackKeepOld bool
	// Zlib is "" (records as the clients send them), "zlibstorage" (the
	// server compresses what it stores when ZlibCompress is set, and
	// decompresses what it loads) or "serverzlibstorage" (records pass
	// as they are, the clients compress and decompress; a conflict
	// resolved in the server is stored compressed when ZlibCompress is
	// set). ZlibCompress is the section's compress key (true by
	// default). Pack's garbage collection reads compressed records in
	// every case.
	Zlib         string
	ZlibCompress bool
}

// section is a parsed ZConfig section.
type section struct {
	typ, name string
	keys      map[string]keyValue // a key is given once (refused twice, as ZConfig)
	subs      []*section
	line      int
	imports   map[string]bool // root only: the packages of %import lines
}

// tag is the section's opening tag as written, `<typ name>` (`<typ>` for
// an unnamed section), for errors.
func (s *section) tag() string {
	if s.name == "" {
		return "<" + s.typ + ">"
	}
	return "<" + s.typ + " " + s.name + ">"
}

// keyValue is a key's value and the line that gives it.
type keyValue struct {
	v    string
	line int
}

// each calls fn with the keys of s in the order of their lines (so that
// the first bad key is the one reported) and returns fn's first error,
// prefixed with the key's line.
func (s *section) each(fn func(k, v string) error) error {
	keys := make([]string, 0, len(s.keys))
	for k := range s.keys {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return s.keys[a].line - s.keys[b].line })
	for _, k := range keys {
		if err := fn(k, s.keys[k].v); err != nil {
			return fmt.Errorf("line %d: %w", s.keys[k].line, err)
		}
	}
	return nil
}

// noSubs refuses the sections nested in s, which holds none.
func (s *section) noSubs() error {
	if len(s.subs) > 0 {
		return fmt.Errorf("line %d: <%s> cannot hold <%s>", s.subs[0].line, s.typ, s.subs[0].typ)
	}
	return nil
}

// ParseConfigFile parses a runzeo configuration file.
func ParseConfigFile(path string) (*FileConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cfg, err := ParseConfig(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig parses runzeo configuration text: the <zeo>, storage and
// <eventlog> sections. The storages are <filestorage>, possibly inside a
// <blobstorage> and zc.zlibstorage's <zlibstorage> or <serverzlibstorage>
// (after %import zc.zlibstorage); other storage types, and %import of
// other packages, are refused with an error naming the line.
func ParseConfig(r io.Reader) (*FileConfig, error) {
	root, err := parseZConfig(r)
	if err != nil {
		return nil, err
	}
	cfg := &FileConfig{InvalidationQueueSize: 100}
	unnamed := 0
	zeos := 0
	for _, s := range root.subs {
		switch s.typ {
		case "zeo":
			if zeos++; zeos > 1 {
				return nil, fmt.Errorf("line %d: a second <zeo> section", s.line)
			}
			if err := cfg.zeoSection(s); err != nil {
				return nil, err
			}
		case "filestorage", "blobstorage", "zlibstorage", "serverzlibstorage":
			fs, err := storageSection(s, s.name, root.imports)
			if err != nil {
				return nil, err
			}
			if err := cfg.addStorage(fs, s, &unnamed); err != nil {
				return nil, err
			}
		case "eventlog":
			if cfg.EventLog != nil {
				return nil, fmt.Errorf("line %d: a second <eventlog> section", s.line)
			}
			if cfg.EventLog, err = eventlogSection(s); err != nil {
				return nil, err
			}
		case "runner":
			// zdaemon's options (zeoctl); nothing for the server itself,
			// but checked as zdaemon's schema does.
			if err := runnerSection(s); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("line %d: section <%s> is not supported (zodbd serves filestorage sections)", s.line, s.typ)
		}
	}
	if cfg.Address == "" {
		return nil, fmt.Errorf("<zeo> section with an address is required")
	}
	if len(cfg.Storages) == 0 {
		return nil, fmt.Errorf("no storage section")
	}
	return cfg, nil
}

// runnerKeys are the keys of zdaemon's <runner> section (zdaemon's
// schema), which zeoctl reads and the server does not.
var runnerKeys = map[string]bool{
	"program": true, "daemon": true, "directory": true, "backoff-limit": true, "forever": true,
	"exit-codes": true, "hang-around": true, "default-to-interactive": true, "logfile": true,
	"transcript": true, "socket-name": true, "prompt": true, "user": true, "umask": true,
	"start-test-program": true, "start-timeout": true, "stop-timeout": true,
	"python": true, "zdrun": true,
}

// runnerSection checks <runner>: zdaemon's keys only, and at most one
// nested <eventlog> (zdaemon's own log, which zeoctl configures; checked
// as the server's, not used).
func runnerSection(s *section) error {
	for i, sub := range s.subs {
		if sub.typ != "eventlog" || i > 0 {
			return fmt.Errorf("line %d: <%s> inside <runner>: only one <eventlog> may be (zdaemon's schema)", sub.line, sub.typ)
		}
		if _, err := eventlogSection(sub); err != nil {
			return err
		}
	}
	return s.each(func(k, _ string) error {
		if !runnerKeys[k] {
			return fmt.Errorf("<runner> %s: unknown key (zdaemon's runner keys only)", k)
		}
		return nil
	})
}

// CheckHTTPAddr checks an address for the metrics listener (http-addr,
// --http-addr): HOST:PORT, with an empty HOST for every interface and
// port 0 for one the system picks.
func CheckHTTPAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not HOST:PORT", addr)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("%q: port %q is not a number from 0 to 65535", addr, port)
	}
	return nil
}

func (cfg *FileConfig) zeoSection(s *section) error {
	err := s.each(func(k, v string) error {
		var err error
		switch k {
		case "address":
			cfg.Address, err = v, CheckAddress(v)
		case "read-only":
			cfg.ReadOnly, err = parseBool(v)
		case "invalidation-queue-size":
			if cfg.InvalidationQueueSize, err = strconv.Atoi(v); err == nil && cfg.InvalidationQueueSize < 1 {
				err = fmt.Errorf("%d: want at least 1", cfg.InvalidationQueueSize)
			}
		case "invalidation-age":
			cfg.InvalidationAge, err = ParseInvalidationAge(v)
		case "transaction-timeout":
			var n int64
			switch n, err = strconv.ParseInt(v, 10, 64); {
			case err != nil:
			case n == 0:
				// runzeo's TimeoutThread(0) times out every transaction
				// as soon as it takes the commit lock.
				err = fmt.Errorf("0 would time out every transaction as it takes the commit lock (as runzeo does); leave the key out for no timeout")
			case n < 0 || n > math.MaxInt64/int64(time.Second):
				err = fmt.Errorf("%d: want 1 or more seconds, at most %d", n, math.MaxInt64/int64(time.Second))
			}
			cfg.TransactionTimeout = time.Duration(n) * time.Second
		case "pid-filename":
			cfg.PidFile = expandUser(v)
		case "client-conflict-resolution":
			cfg.ClientConflictResolution, err = parseBool(v)
		case "msgpack":
			var b bool
			b, err = parseBool(v)
			cfg.Msgpack = &b
		case "busy-poll":
			cfg.BusyPoll = v
			_, err = busypoll.ParseSpin(v)
		case "http-addr":
			cfg.HTTPAddr, err = v, CheckHTTPAddr(v)
		default:
			err = fmt.Errorf("unknown key")
		}
		if err != nil {
			return fmt.Errorf("<zeo> %s: %w", k, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, sub := range s.subs {
		if sub.typ != "ssl" {
			return fmt.Errorf("line %d: <zeo> cannot hold <%s>", sub.line, sub.typ)
		}
		if cfg.SSL != nil {
			return fmt.Errorf("line %d: a second <ssl> section", sub.line)
		}
		if err := sub.noSubs(); err != nil {
			return err
		}
		ssl := &SSLConfig{}
		err := sub.each(func(k, v string) error {
			switch k {
			case "certificate":
				ssl.Certificate = expandUser(v)
			case "key":
				ssl.Key = expandUser(v)
			case "authenticate":
				ssl.Authenticate = v
			case "password-function":
				return fmt.Errorf("<ssl> password-function names a Python callable, which zodbd cannot run")
			default:
				return fmt.Errorf("<ssl> %s: unknown key", k)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if ssl.Certificate == "" {
			return fmt.Errorf("line %d: <ssl> needs a certificate", sub.line)
		}
		cfg.SSL = ssl
	}
	return nil
}

// CheckAddress checks a ZEO server address (<zeo> address, zodbd serve -a):
// a Unix socket's path (one with a "/"), or PORT, :PORT, HOST:PORT or
// [IPV6]:PORT with a numeric port from 0 to 65535.
func CheckAddress(addr string) error {
	if strings.Contains(addr, "/") {
		return nil
	}
	port := addr
	if strings.Contains(addr, ":") {
		var err error
		if _, port, err = net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("%q is not PORT, HOST:PORT or a Unix socket's path", addr)
		}
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("%q: port %q is not a number from 0 to 65535", addr, port)
	}
	return nil
}

// parseZConfig parses ZConfig's syntax: "key value" lines, <type name>
// ... </type> sections, # comments, %define NAME VALUE with $NAME / ${NAME}
// substitution. %import is refused (it loads Python code), but for
// zc.zlibstorage, whose storage sections zodbd implements.
func parseZConfig(r io.Reader) (*section, error) {
	root := &section{keys: map[string]keyValue{}, imports: map[string]bool{}}
	stack := []*section{root}
	defines := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		cur := stack[len(stack)-1]
		switch {
		case strings.HasPrefix(line, "%"):
			f := strings.Fields(line[1:])
			if len(f) == 0 {
				return nil, fmt.Errorf("line %d: empty directive", n)
			}
			// As ZConfig: $NAME is replaced in values and in the
			// arguments of directives, never in names (%define's);
			// %define's value is substituted whole, below.
			first := 1
			if strings.EqualFold(f[0], "define") {
				first = len(f)
			}
			for i := first; i < len(f); i++ {
				var err error
				if f[i], err = substitute(f[i], defines); err != nil {
					return nil, fmt.Errorf("line %d: %w", n, err)
				}
			}
			switch strings.ToLower(f[0]) {
			case "define":
				if len(f) < 2 {
					return nil, fmt.Errorf("line %d: %%define needs a name", n)
				}
				if !legalName(f[1]) {
					return nil, fmt.Errorf("line %d: %%define %s: not a name $NAME can refer to (letters, digits and _, not starting with a digit)", n, f[1])
				}
				// The value is the rest of the line after the name, its
				// inner whitespace kept (ZConfig's rest.split(None, 1)).
				val := ""
				if len(f) > 2 {
					rest := strings.TrimSpace(line[1:])
					rest = strings.TrimSpace(rest[len(strings.Fields(rest)[0]):])
					rest = strings.TrimSpace(rest[len(strings.Fields(rest)[0]):])
					var err error
					if val, err = substitute(rest, defines); err != nil {
						return nil, fmt.Errorf("line %d: %w", n, err)
					}
				}
				name := strings.ToLower(f[1])
				if old, ok := defines[name]; ok && old != val {
					return nil, fmt.Errorf("line %d: cannot redefine %s", n, f[1]) // as ZConfig
				}
				defines[name] = val
			case "import":
				if len(f) == 2 && f[1] == "zc.zlibstorage" {
					root.imports[f[1]] = true
					break
				}
				return nil, fmt.Errorf("line %d: %%import loads Python code, which zodbd cannot run (it knows zc.zlibstorage's sections only)", n)
			default:
				return nil, fmt.Errorf("line %d: unknown directive %%%s", n, f[0])
			}
		case strings.HasPrefix(line, "</"):
			if !strings.HasSuffix(line, ">") {
				return nil, fmt.Errorf("line %d: malformed section end", n)
			}
			typ := strings.ToLower(strings.TrimSpace(line[2 : len(line)-1]))
			if len(stack) == 1 || cur.typ != typ {
				return nil, fmt.Errorf("line %d: </%s> does not close an open section", n, typ)
			}
			stack = stack[:len(stack)-1]
		case strings.HasPrefix(line, "<"):
			if !strings.HasSuffix(line, ">") {
				return nil, fmt.Errorf("line %d: malformed section start", n)
			}
			body := strings.TrimSpace(line[1 : len(line)-1])
			empty := strings.HasSuffix(body, "/")
			body = strings.TrimSpace(strings.TrimSuffix(body, "/"))
			f := strings.Fields(body)
			if len(f) == 0 || len(f) > 2 {
				return nil, fmt.Errorf("line %d: malformed section start", n)
			}
			s := &section{typ: strings.ToLower(f[0]), keys: map[string]keyValue{}, line: n}
			if len(f) == 2 {
				s.name = strings.ToLower(f[1]) // ZConfig's section names are case-insensitive: lower case
			}
			cur.subs = append(cur.subs, s)
			if !empty {
				stack = append(stack, s)
			}
		default:
			k, v, _ := strings.Cut(line, " ")
			if i := strings.IndexAny(line, " \t"); i >= 0 {
				k, v = line[:i], line[i+1:]
			}
			k = strings.ToLower(k)
			if _, dup := cur.keys[k]; dup {
				// ZConfig refuses it too (no key of these sections is
				// a multikey): the last value does not win silently.
				return nil, fmt.Errorf("line %d: %s given twice in this section", n, k)
			}
			v, err := substitute(strings.TrimSpace(v), defines)
			if err != nil {
				return nil, fmt.Errorf("line %d: %s: %w", n, k, err)
			}
			cur.keys[k] = keyValue{v, n}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(stack) > 1 {
		return nil, fmt.Errorf("section <%s> (line %d) is not closed", stack[len(stack)-1].typ, stack[len(stack)-1].line)
	}
	if err := root.each(func(k, _ string) error { return fmt.Errorf("key %q outside of any section", k) }); err != nil {
		return nil, err
	}
	return root, nil
}

func substitute(s string, defines map[string]string) (string, error) {
	if !strings.Contains(s, "$") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '$' {
			b.WriteByte('$')
			i++
			continue
		}
		if i+1 < len(s) && s[i+1] == '(' {
			end := strings.IndexByte(s[i:], ')')
			if end < 0 {
				end = len(s) - i - 1
			}
			return "", fmt.Errorf("%s: environment substitution is not supported (use %%define)", s[i:i+end+1])
		}
		var name string
		if i+1 < len(s) && s[i+1] == '{' {
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return "", fmt.Errorf("unterminated ${")
			}
			name = s[i+2 : i+end]
			i += end
		} else {
			j := i + 1
			for j < len(s) && (s[j] == '_' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= '0' && s[j] <= '9') {
				j++
			}
			name = s[i+1 : j]
			i = j - 1
			if name == "" {
				return "", fmt.Errorf("a $ with no name after it (write $$ for a dollar sign)")
			}
		}
		v, ok := defines[strings.ToLower(name)]
		if !ok {
			return "", fmt.Errorf("undefined name $%s", name)
		}
		b.WriteString(v)
	}
	return b.String(), nil
}

// legalName reports whether a %define name can be referred to by $NAME.
func legalName(name string) bool {
	for i, c := range name {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return name != ""
}

func parseBool(s string) (bool, error) {
	switch strings.ToLower(s) {
	case "true", "yes", "on", "1":
		return true, nil
	case "false", "no", "off", "0":
		return false, nil
	}
	return false, fmt.Errorf("%q is not a boolean", s)
}

// parseSize parses ZConfig's byte-size: a number with an optional KB, MB,
// GB suffix (powers of 1024).
func parseSize(s string) (int64, error) {
	u := strings.ToUpper(strings.TrimSpace(s))
	mult := int64(1)
	for _, suf := range []struct {
		s string
		m int64
	}{{"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"TB", 1 << 40}} {
		if strings.HasSuffix(u, suf.s) {
			mult = suf.m
			u = strings.TrimSpace(strings.TrimSuffix(u, suf.s))
			break
		}
	}
	n, err := strconv.ParseInt(u, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a byte size", s)
	}
	if n > math.MaxInt64/mult || n < math.MinInt64/mult {
		return 0, fmt.Errorf("%q: too big (at most 8 EB)", s)
	}
	return n * mult, nil
}

// storageSection parses a storage section and the sections it wraps, down
// to the <filestorage>; name (the outermost section's) names the storage.
func storageSection(s *section, name string, imports map[string]bool) (FileStorageConfig, error) {
	switch s.typ {
	case "filestorage":
		return filestorageSection(s, name)
	case "blobstorage", "zlibstorage", "serverzlibstorage":
	default:
		return FileStorageConfig{}, fmt.Errorf("line %d: section <%s> is not supported (zodbd serves filestorage sections)", s.line, s.typ)
	}
	// A wrapper: <blobstorage NAME> blob-dir DIR <storage/> </blobstorage>
	// (ZODB/py's BlobStorage), <zlibstorage NAME> [compress BOOL]
	// <storage/> </zlibstorage> (zc.zlibstorage), around one storage.
	isZlib := s.typ != "blobstorage"
	if isZlib && !imports["zc.zlibstorage"] {
		return FileStorageConfig{}, fmt.Errorf("line %d: section <%s> needs %%import zc.zlibstorage", s.line, s.typ)
	}
	var dir string
	compress := true
	err := s.each(func(k, v string) error {
		var err error
		switch {
		case k == "blob-dir" && !isZlib:
			dir = v
		case k == "compress" && isZlib:
			compress, err = parseBool(v)
		default:
			err = fmt.Errorf("unknown key")
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", s.tag(), k, err)
		}
		return nil
	})
	if err != nil {
		return FileStorageConfig{}, err
	}
	if !isZlib && dir == "" {
		return FileStorageConfig{}, fmt.Errorf("line %d: %s has no blob-dir", s.line, s.tag())
	}
	if len(s.subs) != 1 {
		return FileStorageConfig{}, fmt.Errorf("line %d: %s must hold exactly one storage section", s.line, s.tag())
	}
	fs, err := storageSection(s.subs[0], name, imports)
	if err != nil {
		return fs, err
	}
	if isZlib {
		if fs.Zlib != "" {
			return fs, fmt.Errorf("line %d: %s inside another zlib storage section", s.line, s.tag())
		}
		fs.Zlib, fs.ZlibCompress = s.typ, compress
	} else {
		if fs.BlobDir != "" {
			return fs, fmt.Errorf("line %d: %s around a storage that has a blob directory", s.line, s.tag())
		}
		fs.BlobDir, fs.BlobWrapper = dir, true
	}
	return fs, nil
}

// filestorageSection parses a <filestorage> section; name is the storage's
// name ("" when unnamed). A <blobstorage> around it sets BlobDir after.
func filestorageSection(s *section, name string) (FileStorageConfig, error) {
	fs := FileStorageConfig{Name: name, PackGC: true, PackKeepOld: true}
	if err := s.noSubs(); err != nil {
		return fs, err
	}
	err := s.each(func(k, v string) error {
		var err error
		switch k {
		case "path":
			fs.Path = expandUser(v)
		case "blob-dir":
			fs.BlobDir = expandUser(v)
		case "create":
			fs.Create, err = parseBool(v)
		case "read-only":
			fs.ReadOnly, err = parseBool(v)
		case "quota":
			if fs.Quota, err = parseSize(v); err == nil && fs.Quota <= 0 {
				err = fmt.Errorf("%q: a quota must be positive (ZODB/py would refuse every store; leave quota out for none)", v)
			}
		case "pack-gc":
			fs.PackGC, err = parseBool(v)
		case "pack-keep-old":
			fs.PackKeepOld, err = parseBool(v)
		case "packer":
			err = fmt.Errorf("packer names a Python callable, which zodbd cannot run")
		default:
			err = fmt.Errorf("unknown key")
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", s.tag(), k, err)
		}
		return nil
	})
	if err != nil {
		return fs, err
	}
	if fs.Path == "" {
		return fs, fmt.Errorf("line %d: %s has no path", s.line, s.tag())
	}
	return fs, nil
}

// addStorage adds a parsed storage, naming an unnamed one "1".
func (cfg *FileConfig) addStorage(fs FileStorageConfig, s *section, unnamed *int) error {
	if fs.Name == "" {
		*unnamed++
		if *unnamed > 1 {
			return fmt.Errorf("line %d: more than one unnamed storage section", s.line)
		}
		fs.Name = "1"
	}
	for _, other := range cfg.Storages {
		if other.Name == fs.Name {
			return fmt.Errorf("line %d: storage %q defined twice", s.line, fs.Name)
		}
	}
	cfg.Storages = append(cfg.Storages, fs)
	return nil
}

// ParseInvalidationAge parses invalidation-age: seconds, not negative; a value too big
// for a time.Duration (about 292 years) is that maximum.
func ParseInvalidationAge(v string) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, err
	}
	if !(f >= 0) { // NaN too
		return 0, fmt.Errorf("%q: want a number of seconds, 0 or more", v)
	}
	return min(f, float64(math.MaxInt64/int64(time.Second))), nil
}

// expandUser is Python's os.path.expanduser, which ZConfig's datatype
// existing-dirpath applies: to <filestorage>'s path and blob-dir,
// pid-filename and <ssl>'s certificate and key (not to <blobstorage>'s
// blob-dir nor to log paths, which runzeo takes as they are). "~" and
// "~/..." are $HOME (the user's home directory where HOME is not set),
// "~NAME/..." NAME's home directory; a path whose user is unknown is left
// as it is.
func expandUser(p string) string {
	if !strings.HasPrefix(p, "~") {
		return p
	}
	i := strings.IndexByte(p, '/')
	if i < 0 {
		i = len(p)
	}
	var home string
	if i == 1 {
		if home = os.Getenv("HOME"); home == "" {
			u, err := user.Current()
			if err != nil {
				return p
			}
			home = u.HomeDir
		}
	} else {
		u, err := user.Lookup(p[1:i])
		if err != nil {
			return p
		}
		home = u.HomeDir
	}
	if p = strings.TrimRight(home, "/") + p[i:]; p == "" {
		return "/"
	}
	return p
}
