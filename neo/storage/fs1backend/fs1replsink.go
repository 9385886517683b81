package fs1backend

// FS1Backend is no ReplicationSink: a FileStorage node cannot be the
// destination of a replication, and the node refuses an OUT_OF_DATE cell
// on it (a fatal error naming the reason; replicator.go).
//
// What a FileStorage node can hold: the whole database as one partition
// (a cluster of 1 partition, `neomaster -p 1`), UP_TO_DATE from the start
// because its file already has the data; with replicas it can feed other
// nodes (serving side) but not catch up itself. Appending replicated
// transactions is not done because FileStorage keeps transactions in tid
// order in one file, while NEO's replication needs the node to commit the
// transactions that begin during the replication (newer tids, through the
// commit path) before the older ones it fetches have all arrived; a node
// that must receive all partitions of a live cluster therefore has to run
// on the SQLite backend.
