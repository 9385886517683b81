package resolve

// Pickle opcodes of protocols 0 to 3 (and those of 4 and 5 only to name
// them in errors: the decoder refuses them, as zodbpickle does).
const (
	opMark           = '('
	opStop           = '.'
	opPop            = '0'
	opPopMark        = '1'
	opDup            = '2'
	opFloat          = 'F'
	opInt            = 'I'
	opBinint         = 'J'
	opBinint1        = 'K'
	opLong           = 'L'
	opBinint2        = 'M'
	opNone           = 'N'
	opPersid         = 'P'
	opBinpersid      = 'Q'
	opReduce         = 'R'
	opString         = 'S'
	opBinstring      = 'T'
	opShortBinstring = 'U'
	opUnicode        = 'V'
	opBinunicode     = 'X'
	opAppend         = 'a'
	opBuild          = 'b'
	opGlobal         = 'c'
	opDict           = 'd'
	opEmptyDict      = '}'
	opAppends        = 'e'
	opGet            = 'g'
	opBinget         = 'h'
	opInst           = 'i'
	opLongBinget     = 'j'
	opList           = 'l'
	opEmptyList      = ']'
	opObj            = 'o'
	opPut            = 'p'
	opBinput         = 'q'
	opLongBinput     = 'r'
	opSetitem        = 's'
	opTuple          = 't'
	opEmptyTuple     = ')'
	opSetitems       = 'u'
	opBinfloat       = 'G'
	opBinbytes       = 'B'
	opShortBinbytes  = 'C'

	opProto    = 0x80
	opNewobj   = 0x81
	opExt1     = 0x82
	opExt2     = 0x83
	opExt4     = 0x84
	opTuple1   = 0x85
	opTuple2   = 0x86
	opTuple3   = 0x87
	opNewtrue  = 0x88
	opNewfalse = 0x89
	opLong1    = 0x8a
	opLong4    = 0x8b
)
