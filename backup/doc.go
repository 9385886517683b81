// Package backup makes and restores incremental backups of a FileStorage
// file (Data.fs) in the on-disk format of ZODB's repozo, so that repozo
// restores the sets this package writes and this package restores repozo's.
//
// # The repository format (repozo's)
//
// A repository is a directory of backup sets. A set is one full backup and
// the incremental backups taken after it, each file named by the UTC time the
// backup began:
//
//	YYYY-MM-DD-hh-mm-ss.fs        full backup: bytes [0, end) of Data.fs
//	YYYY-MM-DD-hh-mm-ss.deltafs   incremental: bytes [start, end)
//	                              (.fsz, .deltafsz: the same, gzip-compressed)
//	YYYY-MM-DD-hh-mm-ss.index     Data.fs.index as of the end of that file
//	YYYY-MM-DD-hh-mm-ss.dat       beside the full backup only: one line per
//	                              file of the set, "PATH START END MD5", the
//	                              md5 (hex) of the uncompressed bytes
//
// Concatenating the (uncompressed) files of a set in name order gives
// Data.fs as it was when the last one was taken. Every file starts and ends
// on a transaction boundary.
//
// # Beyond repozo
//
// Blobs: with a blob directory, the blob files are copied into REPO/blobs
// (the blob directory's own layout), only the files that are not there yet.
// Restore copies them back, leaving out the blobs of transactions after the
// restored point.
//
// Consistency with a running server: the live file is only read (no lock),
// up to the end of the last transaction whose status is not 'c' (in
// progress), and through one file descriptor, so a pack that swaps the file
// meanwhile does not mix two files.
//
// Crash safety: every file is written under a temporary name, synced,
// renamed into place and its directory synced; the .dat is rewritten the
// same way and last for an incremental backup (first, before the full
// backup's rename, for a full one, whose .dat repozo ignores without its
// .fs). A backup interrupted at any moment leaves the previous set as it
// was; the next backup removes what the interrupted one left.
//
// Point-in-time restore: Restore can stop at the last transaction at or
// before any tid, not only at the end of a backup file, and then rebuilds
// the index. Verify recomputes every checksum of a set and also checks the
// transaction structure of the bytes, reporting the first bad file with the
// offset of the damage where it can tell.
package backup
