package clientcore

import "testing"

type call struct {
	flightCall
}

// ready reports whether ch holds a signal, consuming it.
func ready(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestLifecycle(t *testing.T) {
	var free freeList[call]
	c := free.Get()
	c.Start()
	c.Ref() // the caller that makes the request
	a, b := free.Chan(), free.Chan()
	c.Wait(a)
	c.Wait(b)
	if ready(a) || c.Finished() {
		t.Fatal("signalled before Finish")
	}
	if c.Finish() {
		t.Fatal("Finish reported the last reference with three callers left")
	}
	if !c.Finished() || !ready(a) || !ready(b) {
		t.Fatal("Finish did not signal every waiter")
	}
	if c.Release(nil, true) || c.Release(a, true) {
		t.Fatal("a release before the last reported the last reference")
	}
	if !c.Release(b, true) {
		t.Fatal("the last release did not report it")
	}
	c.Reset()
	free.Put(c)
	free.PutChan(a)
	if free.Get() != c || free.Chan() != a {
		t.Error("freeList did not give back what was put")
	}
	if free.Get() == c {
		t.Error("freeList gave the same call twice")
	}
}

// A waiter cancelled before the call finishes is withdrawn: Finish does
// not signal its channel, which stays empty for reuse.
func TestCancelBeforeFinish(t *testing.T) {
	var c flightCall
	c.Start()
	a, b := make(chan struct{}, 1), make(chan struct{}, 1)
	c.Wait(a)
	c.Wait(b)
	if c.Release(a, false) {
		t.Fatal("last reference with the request still in flight")
	}
	if c.Finish() {
		t.Fatal("last reference with a waiter left")
	}
	if ready(a) {
		t.Error("a withdrawn waiter was signalled")
	}
	if !ready(b) {
		t.Error("the remaining waiter was not signalled")
	}
	if !c.Release(b, true) {
		t.Error("the last release did not report it")
	}
}

// A waiter cancelled after the call finished (it gave up before seeing
// its signal) has its signal drained, so its channel can be reused.
func TestCancelAfterFinish(t *testing.T) {
	var c flightCall
	c.Start()
	a := make(chan struct{}, 1)
	c.Wait(a)
	c.Finish()
	if !c.Release(a, false) {
		t.Fatal("the last release did not report it")
	}
	if ready(a) {
		t.Error("the signal of a cancelled waiter was left in its channel")
	}
}

// A request nobody waits for (a prefetch) is recycled by Finish.
func TestNoWaiter(t *testing.T) {
	var c flightCall
	c.Start()
	if !c.Finish() {
		t.Error("Finish of a call nobody waits for did not report the last reference")
	}
}

func TestFreeBound(t *testing.T) {
	var free freeList[call]
	for i := 0; i < 2*MaxFree; i++ {
		free.Put(new(call))
		free.PutChan(make(chan struct{}, 1))
	}
	free.PutChan(nil)
	if len(free.calls) != MaxFree || len(free.chans) != MaxFree {
		t.Errorf("free lists hold %d calls and %d channels, want at most %d", len(free.calls), len(free.chans), MaxFree)
	}
}
