package storage

import "context"

// replPipe writes what the replicator fetched on a goroutine of its own, in
// the order it was handed over, so that the next chunk is asked for and
// received from the source while the previous one is being stored: the
// source's reading and sending then overlap the sink's writing, instead of
// each side waiting for the other in turn. The order of the sink's calls is
// that of a replicator without it (stores, then the progress recorded);
// what changes is that the next request may leave before they are done.
// That is safe because each request lists what this node has after the
// position of the previous chunk's end, which the writes still in flight
// (all before it) do not touch.
//
// At most pipeDepth jobs wait; a full pipe blocks the fetcher (memory is
// bounded to a few chunks). After the first failed job the others are
// skipped and the error is what wait (and failed) return. Batches given to
// store come back, emptied, from batch, which reuses their memory.
type replPipe struct {
	ctx  context.Context
	sink ReplicationSink
	jobs chan func(context.Context) error
	free chan *replBuf
	done chan struct{}
	err  error // the first job's error, read after done is closed or through errc
	errc chan error
}

// pipeDepth is the number of jobs that may wait behind the running one.
const pipeDepth = 2

// replBuf is a batch and the memory its records' bytes are copied into
// (arena), reused from one chunk to the next.
type replBuf struct {
	b     ReplBatch
	arena []byte
	held  int // bytes of record data in b
}

// keep copies data into the buffer's arena and returns the copy: one
// allocation per arena growth instead of one per record.
func (r *replBuf) keep(data []byte) []byte {
	if len(data) == 0 {
		return []byte{}
	}
	if cap(r.arena)-len(r.arena) < len(data) {
		// The records already kept point into the old array, which
		// stays theirs; the new one takes the next ones.
		r.arena = make([]byte, 0, max(2*cap(r.arena), len(data), 1<<20))
	}
	n := len(r.arena)
	r.arena = append(r.arena, data...)
	r.held += len(data)
	return r.arena[n:len(r.arena):len(r.arena)]
}

func (r *replBuf) reset() {
	clear(r.b.Txns)
	clear(r.b.Objects)
	r.b = ReplBatch{Txns: r.b.Txns[:0], Objects: r.b.Objects[:0]}
	r.arena = r.arena[:0]
	r.held = 0
}

func newReplPipe(ctx context.Context, sink ReplicationSink) *replPipe {
	p := &replPipe{ctx: ctx, sink: sink, jobs: make(chan func(context.Context) error, pipeDepth),
		free: make(chan *replBuf, pipeDepth+2), done: make(chan struct{}), errc: make(chan error, 1)}
	go p.loop()
	return p
}

func (p *replPipe) loop() {
	defer close(p.done)
	for job := range p.jobs {
		if p.err != nil {
			continue
		}
		if err := job(p.ctx); err != nil {
			p.err = err
			p.errc <- err
		}
	}
}

// batch returns an empty buffer to fill.
func (p *replPipe) batch() *replBuf {
	select {
	case r := <-p.free:
		return r
	default:
		return &replBuf{}
	}
}

// store queues the write of r's batch; r belongs to the pipe from then on.
func (p *replPipe) store(r *replBuf) error {
	return p.do(func(ctx context.Context) error {
		err := p.sink.StoreReplicated(ctx, &r.b)
		r.reset()
		select {
		case p.free <- r:
		default:
		}
		return err
	})
}

// do queues job; it returns the error of a job that failed before, if
// any (then job is not queued).
func (p *replPipe) do(job func(context.Context) error) error {
	if err := p.failed(); err != nil {
		return err
	}
	select {
	case p.jobs <- job:
		return nil
	case err := <-p.errc:
		p.errc <- err
		return err
	}
}

// failed returns the error of a job that failed, nil when none has.
func (p *replPipe) failed() error {
	select {
	case err := <-p.errc:
		p.errc <- err
		return err
	default:
		return nil
	}
}

// wait returns once every queued job ran (or was skipped after a failure),
// with the first error. The pipe cannot be used after.
func (p *replPipe) wait() error {
	close(p.jobs)
	<-p.done
	return p.err
}

// drain returns once the jobs queued so far ran, with the first error: a
// chunk whose answer deletes records this node has must be written before
// the next request lists what this node has (the deleted ones may lie
// after the chunk's end, then fetched again).
func (p *replPipe) drain() error {
	ran := make(chan struct{})
	if err := p.do(func(context.Context) error { close(ran); return nil }); err != nil {
		return err
	}
	select {
	case <-ran:
		return nil
	case err := <-p.errc:
		p.errc <- err
		return err
	}
}
