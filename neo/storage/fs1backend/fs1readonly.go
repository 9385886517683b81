package fs1backend

// ReadOnly implements ReadOnlyBackend: a FileStorage opened with OpenFS1
// (or NewFS1) is served read-only; one opened with OpenFS1Writer takes
// commits.
//
// (It belongs in fs1writer.go, beside the field it reads; it is here so
// that the node's branch does not edit the backend's files.)
func (b *FS1Backend) ReadOnly() bool { return b.w == nil }
