package zodbtools

import (
	"context"
	"fmt"
	"io"

	"github.com/zodbd/zodbd/zodb"
)

// InfoItem is one line of `zodbd info`.
type InfoItem struct {
	Name, Value string
}

// Info writes "name=value" lines describing stor, followed by the extra
// items (engine-specific facts such as the file size).
func Info(ctx context.Context, w io.Writer, stor zodb.Storage, extra ...InfoItem) error {
	last, err := stor.LastTid(ctx)
	if err != nil {
		return err
	}
	lastOid, err := stor.LastOid(ctx)
	if err != nil {
		return err
	}
	items := []InfoItem{
		{"name", stor.URL()},
		{"head", last.String()},
	}
	if last != 0 {
		items = append(items, InfoItem{"head_time", last.TimeStamp().String()})
	}
	items = append(items, InfoItem{"last_oid", lastOid.String()})
	items = append(items, extra...)
	for _, it := range items {
		if _, err := fmt.Fprintf(w, "%s=%s\n", it.Name, it.Value); err != nil {
			return err
		}
	}
	return nil
}

// CatObj writes the data of the revision xid names.
func CatObj(ctx context.Context, w io.Writer, stor zodb.Loader, xid zodb.Xid) error {
	data, _, err := stor.Load(ctx, xid)
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}
