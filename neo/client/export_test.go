package client

import "github.com/zodbd/zodbd/zodb"

// The client's internals that the external tests look at.

// SetKeptData sets the data a transaction keeps of its written stores
// and the data it sends before waiting for answers; the returned function
// restores them.
func SetKeptData(kept, flight int) (restore func()) {
	oldKept, oldFlight := keptData, flightData
	keptData, flightData = kept, flight
	return func() { keptData, flightData = oldKept, oldFlight }
}

// HeldData returns the bytes of store data the transaction zt (begun by a
// Client) holds.
func HeldData(zt zodb.Txn) int {
	t := zt.(*txn)
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.held
}
