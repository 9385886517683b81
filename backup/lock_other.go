//go:build !unix

package backup

// lockRepo does nothing where there is no flock.
func lockRepo(dir string) (unlock func(), err error) { return func() {}, nil }
