package resolve

// classKind is what Resolve does with a class.
type classKind uint8

const (
	cLength  classKind = iota + 1 // BTrees.Length.Length
	cBucket                       // a mapping bucket: XXBucket
	cSet                          // a set bucket: XXSet
	cTree                         // a BTree, resolved only when it is one inline bucket: XXBTree
	cTreeSet                      // a TreeSet, likewise: XXTreeSet
)

// dataType is the C type a BTrees family keeps its keys or values in.
type dataType uint8

const (
	tObj dataType = iota // any Python object (O)
	tI32                 // I: int, 32 bits
	tI64                 // L: int, 64 bits
	tU32                 // U: unsigned int, 32 bits
	tU64                 // Q: unsigned int, 64 bits
	tF32                 // F: float, 32 bits (values only)
	tFs2                 // fs keys: bytes of length 2
	tFs6                 // fs values: bytes of length 6
)

// classInfo describes a class Resolve handles.
type classInfo struct {
	kind     classKind
	key, val dataType
	name     string // module.name
}

// classes maps "module\nname", as GLOBAL writes a class, to its classInfo.
var classes = map[string]*classInfo{}

// families are the BTrees modules (BTrees.<family>BTree) of BTrees 6.
var families = []string{
	"IF", "II", "IO", "IU", "LF", "LL", "LO", "LQ", "OI", "OL", "OO",
	"OQ", "OU", "QF", "QL", "QO", "QQ", "UF", "UI", "UO", "UU", "fs",
}

func init() {
	letter := map[byte]dataType{'O': tObj, 'I': tI32, 'L': tI64, 'U': tU32, 'Q': tU64, 'F': tF32}
	for _, f := range families {
		key, val := tFs2, tFs6
		if f != "fs" {
			key, val = letter[f[0]], letter[f[1]]
		}
		mod := "BTrees." + f + "BTree"
		for _, c := range []struct {
			suffix string
			kind   classKind
		}{{"Bucket", cBucket}, {"Set", cSet}, {"BTree", cTree}, {"TreeSet", cTreeSet}} {
			classes[mod+"\n"+f+c.suffix] = &classInfo{kind: c.kind, key: key, val: val, name: mod + "." + f + c.suffix}
		}
	}
	classes["BTrees.Length\nLength"] = &classInfo{kind: cLength, name: "BTrees.Length.Length"}
}

// lookupClass returns the classInfo of the class GLOBAL wrote as g
// ("module\nname"), or nil.
func lookupClass(g []byte) *classInfo { return classes[string(g)] }
