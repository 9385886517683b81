package resolve

import "testing"

func benchFixture(b *testing.B, name string) {
	f := fixtureNamed(b, name)
	if _, err := Resolve(f.old, f.committed, f.new); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(f.old) + len(f.committed) + len(f.new)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Resolve(f.old, f.committed, f.new); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkResolveLength resolves a conflict of a BTrees.Length.
func BenchmarkResolveLength(b *testing.B) { benchFixture(b, "length") }

// BenchmarkResolveOOBucket resolves a conflict of an OOBucket of 30 str
// keys and values, each side changing one value.
func BenchmarkResolveOOBucket(b *testing.B) { benchFixture(b, "oobucket-30") }

// BenchmarkResolveUnsupported refuses a class Resolve does not handle.
func BenchmarkResolveUnsupported(b *testing.B) {
	f := fixtureNamed(b, "persistentmapping")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Resolve(f.old, f.committed, f.new); err == nil {
			b.Fatal("resolved")
		}
	}
}
