package client

import (
	"context"

	"github.com/zodbd/zodbd/zodb"
)

// Watch implements zodb.Watcher. Events come from the master's
// InvalidateObjects messages, in commit order (this client commits
// nothing). The Oids slice of an event is shared by all watchers: do not
// modify it.
func (c *Client) Watch(ctx context.Context) (<-chan zodb.CommitEvent, error) {
	ch, ok := c.watch.Watch(ctx)
	if !ok {
		err := c.failure()
		if err == nil {
			err = ErrClosed
		}
		return nil, c.opErr("watch", nil, err)
	}
	return ch, nil
}
