package client

import (
	"context"

	"github.com/zodbd/zodbd/zodb"
)

// Watch implements zodb.Watcher. Events come from the server's
// invalidateTransaction messages and from this client's own commits (which
// the server does not send back), in commit order. The Oids slice of an
// event is shared by all watchers: do not modify it.
func (c *Client) Watch(ctx context.Context) (<-chan zodb.CommitEvent, error) {
	ch, ok := c.watch.Watch(ctx)
	if !ok {
		c.pmu.Lock()
		err := c.err
		c.pmu.Unlock()
		if err == nil {
			err = ErrClosed
		}
		return nil, c.opErr("watch", nil, err)
	}
	return ch, nil
}
