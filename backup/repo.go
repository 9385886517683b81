package backup

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/zodbd/zodbd/internal/vfs"
)

// stampLayout is the time part of a backup file's name (UTC), as repozo
// writes it.
const stampLayout = "2006-01-02-15-04-05"

// isDataFile matches the names of repozo's backup data files.
var isDataFile = regexp.MustCompile(`^\d{4}(?:-\d\d){5}\.(?:delta)?fsz?$`)

// repoFile is one backup data file of a repository.
type repoFile struct {
	Name  string // base name, e.g. 2024-01-02-03-04-05.deltafsz
	Stamp string // the name without its extension
	Full  bool   // .fs or .fsz
	Gzip  bool   // .fsz or .deltafsz
}

func parseRepoFile(name string) repoFile {
	ext := filepath.Ext(name)
	return repoFile{
		Name:  name,
		Stamp: strings.TrimSuffix(name, ext),
		Full:  ext == ".fs" || ext == ".fsz",
		Gzip:  strings.HasSuffix(ext, "z"),
	}
}

// listRepo returns the backup data files of the repository dir in name
// (that is, time) order.
func listRepo(dir string) ([]repoFile, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("backup: repository: %w", err)
	}
	var files []repoFile
	for _, e := range ents {
		if isDataFile.MatchString(e.Name()) && e.Type().IsRegular() {
			files = append(files, parseRepoFile(e.Name()))
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	return files, nil
}

// chain is a backup set: a full backup and the incremental backups after
// it (up to the next full one), in order.
type chain []repoFile

// chains groups files (in name order) into sets; incremental files before
// the first full one belong to none.
func chains(files []repoFile) []chain {
	var cs []chain
	for _, f := range files {
		if f.Full {
			cs = append(cs, chain{f})
		} else if len(cs) > 0 {
			cs[len(cs)-1] = append(cs[len(cs)-1], f)
		}
	}
	return cs
}

// upTo returns the files of the set whose stamp is at or before stamp
// (repozo's --date selection), and reports whether any is.
func chainsUpTo(files []repoFile, stamp string) chain {
	// repozo: the newest full backup at or before stamp, then its
	// incrementals up to stamp.
	var c chain
	for _, f := range files {
		if f.Stamp > stamp {
			break
		}
		if f.Full {
			c = chain{f}
		} else if c != nil {
			c = append(c, f)
		}
	}
	return c
}

// datEntry is one line of a .dat file.
type datEntry struct {
	Path       string // as written (repozo: the repository joined with the name)
	Start, End int64
	Sum        string // md5, hex
}

// Name is the entry's file name in the repository (repozo, too, only uses
// the base name when it reads a .dat back).
func (e datEntry) Name() string { return filepath.Base(e.Path) }

func datPath(repo string, full repoFile) string {
	return filepath.Join(repo, full.Stamp+".dat")
}

// readDat reads the .dat file at path. A missing file is (nil, nil).
func readDat(path string) ([]datEntry, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	var es []datEntry
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		f := strings.Fields(text)
		if len(f) == 0 {
			continue
		}
		if len(f) < 4 {
			return nil, fmt.Errorf("backup: %s:%d: want \"PATH START END MD5\", got %q", path, line, text)
		}
		// The path is what comes before the last three fields: it may
		// hold spaces (repozo writes it as it is).
		f = f[len(f)-3:]
		cut := len(text)
		for i := 2; i >= 0; i-- {
			cut = strings.LastIndex(text[:cut], f[i])
		}
		p := strings.TrimRight(text[:cut], " \t")
		start, err1 := strconv.ParseInt(f[0], 10, 64)
		end, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil || start < 0 || end < start {
			return nil, fmt.Errorf("backup: %s:%d: bad positions %q %q", path, line, f[0], f[1])
		}
		if !isMD5(f[2]) {
			// (A line cut inside its md5: taken, it was carried into
			// the next backups' .dat, and every --verify of the set
			// failed.)
			return nil, fmt.Errorf("backup: %s:%d: %q is not an md5 (32 hex digits)", path, line, f[2])
		}
		es = append(es, datEntry{Path: p, Start: start, End: end, Sum: f[2]})
	}
	return es, sc.Err()
}

// isMD5 reports whether s is an md5 as repozo writes it: 32 hex digits.
func isMD5(s string) bool {
	if len(s) != 32 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// formatDat is the text of a .dat file holding es.
func formatDat(es []datEntry) []byte {
	var b bytes.Buffer
	for _, e := range es {
		fmt.Fprintf(&b, "%s %d %d %s\n", e.Path, e.Start, e.End, e.Sum)
	}
	return b.Bytes()
}

// writeFileAtomic makes path hold data durably: a temporary file in the
// same directory, synced, renamed over path, the directory synced.
func writeFileAtomic(fsys vfs.FS, path string, data []byte) error {
	tmp := tempName(path)
	f, err := fsys.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := fsys.WriteAt(f, data, 0); err != nil {
		f.Close()
		fsys.Remove(tmp)
		return err
	}
	if err := fsys.Sync(f); err != nil {
		f.Close()
		fsys.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		fsys.Remove(tmp)
		return err
	}
	if err := fsys.Rename(tmp, path); err != nil {
		fsys.Remove(tmp)
		return err
	}
	return fsys.SyncDir(filepath.Dir(path))
}

// tempName is the temporary name a file is written under before it is
// renamed to path: in the same directory, and matched by none of repozo's
// patterns.
func tempName(path string) string {
	return filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
}

// stampFor is the name stem of a backup begun at t.
func stampFor(t time.Time) string { return t.UTC().Format(stampLayout) }

func dirOf(path string) string { return filepath.Dir(path) }
