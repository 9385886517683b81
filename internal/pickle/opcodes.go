// Package pickle holds what the pickle readers of zodbd share: the opcodes
// of the pickle protocols 0 to 5 (Python's pickletools names, with Op
// before them) and the decoding of STRING's quoted literal (string.go).
package pickle

const (
	OpMark           = '('
	OpStop           = '.'
	OpPop            = '0'
	OpPopMark        = '1'
	OpDup            = '2'
	OpFloat          = 'F'
	OpInt            = 'I'
	OpBinint         = 'J'
	OpBinint1        = 'K'
	OpLong           = 'L'
	OpBinint2        = 'M'
	OpNone           = 'N'
	OpPersid         = 'P'
	OpBinpersid      = 'Q'
	OpReduce         = 'R'
	OpString         = 'S'
	OpBinstring      = 'T'
	OpShortBinstring = 'U'
	OpUnicode        = 'V'
	OpBinunicode     = 'X'
	OpAppend         = 'a'
	OpBuild          = 'b'
	OpGlobal         = 'c'
	OpDict           = 'd'
	OpEmptyDict      = '}'
	OpAppends        = 'e'
	OpGet            = 'g'
	OpBinget         = 'h'
	OpInst           = 'i'
	OpLongBinget     = 'j'
	OpList           = 'l'
	OpEmptyList      = ']'
	OpObj            = 'o'
	OpPut            = 'p'
	OpBinput         = 'q'
	OpLongBinput     = 'r'
	OpSetitem        = 's'
	OpTuple          = 't'
	OpEmptyTuple     = ')'
	OpSetitems       = 'u'
	OpBinfloat       = 'G'

	OpProto    = 0x80
	OpNewobj   = 0x81
	OpExt1     = 0x82
	OpExt2     = 0x83
	OpExt4     = 0x84
	OpTuple1   = 0x85
	OpTuple2   = 0x86
	OpTuple3   = 0x87
	OpNewtrue  = 0x88
	OpNewfalse = 0x89
	OpLong1    = 0x8a
	OpLong4    = 0x8b

	OpBinbytes      = 'B'
	OpShortBinbytes = 'C'

	OpShortBinunicode = 0x8c
	OpBinunicode8     = 0x8d
	OpBinbytes8       = 0x8e
	OpEmptySet        = 0x8f
	OpAdditems        = 0x90
	OpFrozenset       = 0x91
	OpNewobjEx        = 0x92
	OpStackGlobal     = 0x93
	OpMemoize         = 0x94
	OpFrame           = 0x95
	OpBytearray8      = 0x96
	OpNextBuffer      = 0x97
	OpReadonlyBuffer  = 0x98
)
