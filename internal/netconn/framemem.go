package netconn

import (
	"fmt"
	"sync/atomic"
)

// FrameMemory bounds the memory that the frames being received on all the
// connections of a server hold together. A connection receives a frame of
// up to FreeFrame bytes without charge; the buffer of a bigger one, which
// grows as its bytes arrive (a size claimed is not memory spent), is
// charged beyond FreeFrame as it grows, and released once the frame is
// handled or the connection ends. A charge that would pass the bound is
// refused and the connection closed, so that many connections that each
// send most of a big frame cannot take more memory than the bound
// together. Safe for concurrent use.
type FrameMemory struct {
	max int64
	n   atomic.Int64
}

// FreeFrame is the frame buffer a connection holds without charge.
const FreeFrame = 1 << 20

// NewFrameMemory returns a bound of max bytes; nil (no bound) when max <=
// 0.
func NewFrameMemory(max int64) *FrameMemory {
	if max <= 0 {
		return nil
	}
	return &FrameMemory{max: max}
}

// Held returns the bytes charged to m.
func (m *FrameMemory) Held() int64 {
	if m == nil {
		return 0
	}
	return m.n.Load()
}

// A FrameCharge is what one connection charges to a FrameMemory (M nil:
// no bound). It is not safe for concurrent use.
type FrameCharge struct {
	M *FrameMemory
	n int64
}

// Resize brings the charge to that of a frame buffer of size bytes (0:
// none): a *FrameMemoryError, with nothing more charged, when growing it
// would pass the bound.
func (c *FrameCharge) Resize(size int) error {
	if c.M == nil {
		return nil
	}
	d := max(int64(size)-FreeFrame, 0) - c.n
	if d <= 0 {
		c.M.n.Add(d)
		c.n += d
		return nil
	}
	if c.M.n.Add(d) > c.M.max {
		c.M.n.Add(-d)
		return &FrameMemoryError{Buffer: size, Max: c.M.max}
	}
	c.n += d
	return nil
}

// Done releases the charge (the frame was handled, or the connection
// ends) and returns the size of the buffer it stood for (0: none
// charged), for memtrim.Dropped when the buffer is dropped with it.
func (c *FrameCharge) Done() int {
	if c.n == 0 {
		return 0
	}
	size := int(c.n) + FreeFrame
	c.Resize(0)
	return size
}

// FrameMemoryError is the error of a frame refused by its server's
// FrameMemory.
type FrameMemoryError struct {
	Buffer int   // the buffer the frame needed next
	Max    int64 // the bound
}

func (e *FrameMemoryError) Error() string {
	return fmt.Sprintf("a frame's buffer of %d bytes refused: the frames being received on all connections may hold %d bytes beyond %d each", e.Buffer, e.Max, FreeFrame)
}
