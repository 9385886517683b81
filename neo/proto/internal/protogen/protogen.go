// Package protogen generates the packet types of package neo/proto and
// their msgpack codec from one table, neo/proto/packets.txt.
//
// # The table
//
// Lines starting with # are comments. Lines starting with // are the doc
// comment of the declaration that follows. A declaration is a header line
// at column 0, then one indented line per wire element:
//
//	packet CODE KIND NAME [split=FIELD]   a packet: code, kind (request,
//	                                      answer, notification, error), name
//	struct NAME                           a type used inside packets
//
//	<tab>WIRE  FIELDS  TYPE  [// comment]
//
// WIRE is NEO/py's name of the argument (it names the argument in decode
// errors; "-" for none). FIELDS are the Go fields the element fills, comma
// separated, in their declaration order; the boolean field that tells
// whether an optional element is present ends with "?". TYPE is
//
//	scalar        see the scalars table below (tid, oid, bin, ...)
//	NAME          a declared struct, encoded as the array of its elements
//	list(T)       an array of T: a Go slice
//	map(NAME)     a map whose key is NAME's first element and value its
//	              other one (or the array of its others): a Go slice of NAME
//	              kept in wire order
//	ptr(NAME)     nil or NAME: a Go pointer
//	opt(T)        nil or T, with a presence flag (FIELDS has the "?" one)
//	tuple(T,...)  an array whose elements fill fields of the enclosing type
//
// A packet's struct gets its fields in order, its Code method, AppendArgs
// and DecodeArgs; split=FIELD (a top-level bin) adds AppendArgsHead and
// AppendArgsTail, which encode what precedes and follows the field's bytes,
// so that a caller can write big data without copying it. The codes, their
// names and NewMsg come from the packets' headers.
//
// The generated code calls neo/proto's hand-written helpers: appendX and
// the decoder's methods of the scalars, newDecoder, makeList (which bounds
// the lists of a packet by its size) and the decoder's array, mapHeader,
// arrayN and isNil.
package protogen

import (
	"bufio"
	"bytes"
	"fmt"
	"go/format"
	"sort"
	"strconv"
	"strings"
)

// scalar is a wire type that maps to one Go value.
type scalar struct {
	goType string
	zero   string
	enc    string // appends X to b
	dec    string // decodes with decoder D
}

var scalars = map[string]scalar{
	"tid":          {"zodb.Tid", "0", "appendTid(b, X)", "D.tid()"},
	"oid":          {"zodb.Oid", "0", "appendOid(b, X)", "D.oid()"},
	"nid":          {"NodeID", "0", "appendNID(b, X)", "D.nid()"},
	"ptid":         {"uint64", "0", "appendPTid(b, X)", "D.ptid()"},
	"idtime":       {"float64", "0", "appendIdTime(b, X)", "D.idTime()"},
	"u8":           {"uint8", "0", "msgp.AppendUint(b, uint64(X))", "D.u8()"},
	"u8nil":        {"uint8", "0", "msgp.AppendUint(b, uint64(X))", "D.u8OrNil()"},
	"u32":          {"uint32", "0", "msgp.AppendUint(b, uint64(X))", "D.u32()"},
	"u64":          {"uint64", "0", "msgp.AppendUint(b, X)", "D.u64()"},
	"index":        {"int", "0", "appendIndex(b, X)", "D.index()"},
	"bool":         {"bool", "false", "msgp.AppendBool(b, X)", "D.boolean()"},
	"bin":          {"[]byte", "nil", "msgp.AppendBin(b, X)", "D.bin()"},
	"optbin":       {"[]byte", "nil", "appendOptBin(b, X)", "D.optBin()"},
	"str":          {"string", `""`, "appendStrBin(b, X)", "D.str()"},
	"hash":         {"[20]byte", "[20]byte{}", "appendHash(b, &X)", "D.hash()"},
	"addr":         {"Address", "Address{}", "appendAddr(b, X)", "D.addr()"},
	"hostport":     {"Address", "Address{}", "appendHostPort(b, X)", "D.hostPort()"},
	"raw":          {"Raw", "nil", "appendRaw(b, X)", "D.raw()"},
	"errcode":      {"ErrorCode", "0", "msgp.AppendUint(b, uint64(X))", "ErrorCode(D.u32())"},
	"nodetype":     {"NodeType", "0", "msgp.AppendEnum(b, ExtNodeType, int(X))", "D.nodeType()"},
	"optnodetype":  {"NodeType", "0", "appendOptNodeType(b, X)", "D.optNodeType()"},
	"nodestate":    {"NodeState", "0", "msgp.AppendEnum(b, ExtNodeState, int(X))", "D.nodeState()"},
	"cellstate":    {"CellState", "0", "msgp.AppendEnum(b, ExtCellState, int(X))", "D.cellState()"},
	"clusterstate": {"ClusterState", "0", "msgp.AppendEnum(b, ExtClusterState, int(X))", "D.clusterState()"},
}

// texpr is a parsed TYPE.
type texpr struct {
	op   string // "scalar", "struct", "list", "map", "ptr", "opt", "tuple"
	name string // scalar or struct name
	args []*texpr
}

// elem is one wire element of a declaration.
type elem struct {
	wire    string
	fields  []string // value fields, in slot order
	flag    string   // presence flag of opt, "" if none
	order   []string // all fields in declaration order
	typ     *texpr
	comment string
	line    int
}

type decl struct {
	packet bool
	name   string
	code   uint16
	kind   string
	split  string
	doc    []string
	elems  []*elem
	line   int
}

type table struct {
	decls   []*decl
	structs map[string]*decl
}

func errAt(line int, format string, args ...any) error {
	return fmt.Errorf("packets.txt:%d: %s", line, fmt.Sprintf(format, args...))
}

// parse reads the table.
func parse(src []byte) (*table, error) {
	t := &table{structs: map[string]*decl{}}
	var doc []string
	var cur *decl
	sc := bufio.NewScanner(bytes.NewReader(src))
	for ln := 1; sc.Scan(); ln++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "" || strings.HasPrefix(trimmed, "#"):
			continue
		case strings.HasPrefix(line, "//"):
			doc = append(doc, strings.TrimSpace(strings.TrimPrefix(line, "//")))
			continue
		case line[0] != ' ' && line[0] != '\t':
			d, err := parseHeader(strings.Fields(line), ln)
			if err != nil {
				return nil, err
			}
			d.doc, doc = doc, nil
			if _, dup := t.structs[d.name]; dup {
				return nil, errAt(ln, "%s declared twice", d.name)
			}
			t.structs[d.name] = d
			t.decls = append(t.decls, d)
			cur = d
		default:
			if cur == nil {
				return nil, errAt(ln, "element outside a declaration")
			}
			e, err := parseElem(trimmed, ln)
			if err != nil {
				return nil, err
			}
			cur.elems = append(cur.elems, e)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return t, t.check()
}

func parseHeader(f []string, ln int) (*decl, error) {
	switch {
	case len(f) == 2 && f[0] == "struct":
		return &decl{name: f[1], line: ln}, nil
	case (len(f) == 4 || len(f) == 5) && f[0] == "packet":
		code, err := strconv.ParseUint(f[1], 0, 16)
		if err != nil {
			return nil, errAt(ln, "code %s: %v", f[1], err)
		}
		switch f[2] {
		case "request", "answer", "notification", "error":
		default:
			return nil, errAt(ln, "unknown kind %q", f[2])
		}
		d := &decl{packet: true, code: uint16(code), kind: f[2], name: f[3], line: ln}
		if len(f) == 5 {
			s, ok := strings.CutPrefix(f[4], "split=")
			if !ok {
				return nil, errAt(ln, "unknown option %q", f[4])
			}
			d.split = s
		}
		return d, nil
	}
	return nil, errAt(ln, "want 'packet CODE KIND NAME [split=FIELD]' or 'struct NAME'")
}

func parseElem(s string, ln int) (*elem, error) {
	e := &elem{line: ln}
	if i := strings.Index(s, "//"); i >= 0 {
		e.comment = strings.TrimSpace(s[i+2:])
		s = s[:i]
	}
	f := strings.Fields(s)
	if len(f) != 3 {
		return nil, errAt(ln, "want WIRE FIELDS TYPE")
	}
	e.wire = f[0]
	for _, name := range strings.Split(f[1], ",") {
		if n, ok := strings.CutSuffix(name, "?"); ok {
			if e.flag != "" {
				return nil, errAt(ln, "two presence flags")
			}
			e.flag = n
			e.order = append(e.order, n)
			continue
		}
		e.fields = append(e.fields, name)
		e.order = append(e.order, name)
	}
	var err error
	p := &typeParser{s: f[2]}
	if e.typ, err = p.parse(); err != nil {
		return nil, errAt(ln, "type %s: %v", f[2], err)
	}
	if p.s != "" {
		return nil, errAt(ln, "type %s: trailing %q", f[2], p.s)
	}
	return e, nil
}

type typeParser struct{ s string }

func (p *typeParser) parse() (*texpr, error) {
	i := strings.IndexAny(p.s, "(),")
	if i < 0 {
		i = len(p.s)
	}
	name := p.s[:i]
	p.s = p.s[i:]
	if name == "" {
		return nil, fmt.Errorf("missing name")
	}
	switch name {
	case "list", "map", "ptr", "opt", "tuple":
	default:
		if _, ok := scalars[name]; ok {
			return &texpr{op: "scalar", name: name}, nil
		}
		return &texpr{op: "struct", name: name}, nil
	}
	if !strings.HasPrefix(p.s, "(") {
		return nil, fmt.Errorf("%s without (", name)
	}
	p.s = p.s[1:]
	t := &texpr{op: name}
	for {
		a, err := p.parse()
		if err != nil {
			return nil, err
		}
		t.args = append(t.args, a)
		if strings.HasPrefix(p.s, ",") {
			p.s = p.s[1:]
			continue
		}
		if !strings.HasPrefix(p.s, ")") {
			return nil, fmt.Errorf("missing )")
		}
		p.s = p.s[1:]
		break
	}
	if name != "tuple" && len(t.args) != 1 {
		return nil, fmt.Errorf("%s takes one type", name)
	}
	if (name == "map" || name == "ptr") && t.args[0].op != "struct" {
		return nil, fmt.Errorf("%s of a non-struct", name)
	}
	return t, nil
}

// slots returns the Go types of the value fields that t fills.
func (t *table) slots(x *texpr) []string {
	switch x.op {
	case "tuple":
		var s []string
		for _, a := range x.args {
			s = append(s, t.slots(a)...)
		}
		return s
	case "opt":
		return t.slots(x.args[0])
	}
	return []string{t.goType(x)}
}

// goType returns the Go type of a one-slot type.
func (t *table) goType(x *texpr) string {
	switch x.op {
	case "scalar":
		return scalars[x.name].goType
	case "struct":
		return x.name
	case "list":
		return "[]" + t.goType(x.args[0])
	case "map":
		return "[]" + x.args[0].name
	case "ptr":
		return "*" + x.args[0].name
	}
	panic("goType of " + x.op)
}

func (t *table) zero(x *texpr) string {
	switch x.op {
	case "scalar":
		return scalars[x.name].zero
	case "struct":
		return x.name + "{}"
	}
	return "nil"
}

// zeros returns the zero values of the value fields that x fills.
func (t *table) zeros(x *texpr) []string {
	switch x.op {
	case "tuple":
		var s []string
		for _, a := range x.args {
			s = append(s, t.zeros(a)...)
		}
		return s
	case "opt":
		return t.zeros(x.args[0])
	}
	return []string{t.zero(x)}
}

func (t *table) check() error {
	codes := map[uint16]string{}
	for _, d := range t.decls {
		if d.packet {
			if o, dup := codes[d.code]; dup {
				return errAt(d.line, "code %#04x of %s and %s", d.code, o, d.name)
			}
			codes[d.code] = d.name
		} else if len(d.elems) == 0 {
			return errAt(d.line, "struct %s without elements", d.name)
		}
		seen := map[string]bool{}
		for _, e := range d.elems {
			if err := t.checkType(e.typ, e.line, true); err != nil {
				return err
			}
			if n := len(t.slots(e.typ)); n != len(e.fields) {
				return errAt(e.line, "type %s fills %d fields, got %d", e.typ, n, len(e.fields))
			}
			if (e.typ.op == "opt") != (e.flag != "") {
				return errAt(e.line, "a presence flag goes with opt and only with it")
			}
			for _, f := range e.order {
				if seen[f] {
					return errAt(e.line, "field %s twice", f)
				}
				seen[f] = true
			}
		}
		if d.split != "" {
			ok := false
			for _, e := range d.elems {
				ok = ok || (len(e.fields) == 1 && e.fields[0] == d.split && e.typ.op == "scalar" && e.typ.name == "bin")
			}
			if !ok {
				return errAt(d.line, "split=%s: no bin field %s", d.split, d.split)
			}
		}
	}
	return nil
}

func (t *table) checkType(x *texpr, line int, top bool) error {
	switch x.op {
	case "struct":
		s, ok := t.structs[x.name]
		if !ok || s.packet {
			return errAt(line, "unknown type %s", x.name)
		}
	case "opt", "tuple":
		if !top && x.op == "opt" {
			return errAt(line, "opt inside another type")
		}
		if !top && x.op == "tuple" {
			return errAt(line, "tuple inside a list")
		}
	case "map":
		if len(t.structs[x.args[0].name].elems) < 2 {
			return errAt(line, "map of %s: want a key and a value", x.args[0].name)
		}
	}
	for _, a := range x.args {
		if x.op == "tuple" && a.op == "opt" {
			return errAt(line, "opt inside a tuple")
		}
		inner := x.op == "tuple" || (x.op == "opt" && a.op == "tuple")
		if err := t.checkType(a, line, inner); err != nil {
			return err
		}
	}
	return nil
}

func (x *texpr) String() string {
	if len(x.args) == 0 {
		return x.name
	}
	var a []string
	for _, y := range x.args {
		a = append(a, y.String())
	}
	return x.op + "(" + strings.Join(a, ",") + ")"
}

// gen writes Go code; depth numbers the variables of nested loops.
type gen struct {
	t     *table
	b     bytes.Buffer
	depth int
}

func (g *gen) p(format string, args ...any) {
	fmt.Fprintf(&g.b, format, args...)
	g.b.WriteByte('\n')
}

func arrayHeader(n int) string {
	if n < 16 {
		return fmt.Sprintf("append(b, 0x%02x)", 0x90|n)
	}
	return fmt.Sprintf("msgp.AppendArrayHeader(b, %d)", n)
}

// encElems appends the elements of d's fields with prefix (e.g. "m.").
func (g *gen) encElems(elems []*elem, prefix string) {
	for _, e := range elems {
		g.encElem(e, prefix)
	}
}

func (g *gen) encElem(e *elem, prefix string) {
	lv := make([]string, len(e.fields))
	for i, f := range e.fields {
		lv[i] = prefix + f
	}
	if e.flag != "" {
		g.p("if !%s%s {", prefix, e.flag)
		g.p("b = msgp.AppendNil(b)")
		g.p("} else {")
		g.enc(e.typ.args[0], lv)
		g.p("}")
		return
	}
	g.enc(e.typ, lv)
}

// enc appends x whose value fields are lv.
func (g *gen) enc(x *texpr, lv []string) {
	switch x.op {
	case "scalar":
		g.p("b = %s", strings.ReplaceAll(scalars[x.name].enc, "X", lv[0]))
	case "tuple":
		g.p("b = %s", arrayHeader(len(x.args)))
		for _, a := range x.args {
			n := len(g.t.slots(a))
			g.enc(a, lv[:n])
			lv = lv[n:]
		}
	case "struct":
		s := g.t.structs[x.name]
		g.p("b = %s", arrayHeader(len(s.elems)))
		g.encElems(s.elems, lv[0]+".")
	case "ptr":
		s := g.t.structs[x.args[0].name]
		g.p("if %s == nil {", lv[0])
		g.p("b = msgp.AppendNil(b)")
		g.p("} else {")
		g.p("b = %s", arrayHeader(len(s.elems)))
		g.encElems(s.elems, lv[0]+".")
		g.p("}")
	case "list", "map":
		g.depth++
		i, e := fmt.Sprintf("i%d", g.depth), fmt.Sprintf("e%d", g.depth)
		if x.op == "list" {
			g.p("b = msgp.AppendArrayHeader(b, len(%s))", lv[0])
		} else {
			g.p("b = msgp.AppendMapHeader(b, len(%s))", lv[0])
		}
		g.p("for %s := range %s {", i, lv[0])
		el := x.args[0]
		if el.op == "scalar" || el.op == "list" {
			g.enc(el, []string{lv[0] + "[" + i + "]"})
		} else {
			g.p("%s := &%s[%s]", e, lv[0], i)
			if x.op == "list" {
				g.enc(el, []string{e})
			} else {
				s := g.t.structs[el.name]
				g.encElem(s.elems[0], e+".")
				if len(s.elems) == 2 {
					g.encElem(s.elems[1], e+".")
				} else {
					g.p("b = %s", arrayHeader(len(s.elems)-1))
					g.encElems(s.elems[1:], e+".")
				}
			}
		}
		g.p("}")
		g.depth--
	default:
		panic("enc " + x.op)
	}
}

// decElem decodes e into fields with prefix; wire names the argument when
// e is a packet's.
func (g *gen) decElem(e *elem, prefix string, arg bool) {
	lv := make([]string, len(e.fields))
	for i, f := range e.fields {
		lv[i] = prefix + f
	}
	d := "d"
	if arg {
		d = fmt.Sprintf("d.a(%q)", e.wire)
		if e.typ.op != "scalar" {
			g.p("%s", d)
			d = "d"
		}
	}
	if e.flag != "" {
		g.p("if d.isNil() {")
		zs := g.t.zeros(e.typ)
		g.p("%s%s = false", prefix, e.flag)
		for i, z := range zs {
			g.p("%s = %s", lv[i], z)
		}
		g.p("} else {")
		g.p("%s%s = true", prefix, e.flag)
		g.dec(e.typ.args[0], lv, "d")
		g.p("}")
		return
	}
	g.dec(e.typ, lv, d)
}

// dec decodes x into the value fields lv with decoder expression d.
func (g *gen) dec(x *texpr, lv []string, d string) {
	switch x.op {
	case "scalar":
		g.p("%s = %s", lv[0], strings.ReplaceAll(scalars[x.name].dec, "D", d))
	case "tuple":
		g.p("d.arrayN(%d)", len(x.args))
		for _, a := range x.args {
			n := len(g.t.slots(a))
			g.dec(a, lv[:n], "d")
			lv = lv[n:]
		}
	case "struct":
		s := g.t.structs[x.name]
		g.p("d.arrayN(%d)", len(s.elems))
		for _, e := range s.elems {
			g.decElem(e, lv[0]+".", false)
		}
	case "ptr":
		s := g.t.structs[x.args[0].name]
		g.depth++
		p := fmt.Sprintf("p%d", g.depth)
		g.p("if d.isNil() || !d.ok() {")
		g.p("%s = nil", lv[0])
		g.p("} else {")
		g.p("%s := new(%s)", p, s.name)
		g.p("d.arrayN(%d)", len(s.elems))
		for _, e := range s.elems {
			g.decElem(e, p+".", false)
		}
		g.p("%s = %s", lv[0], p)
		g.p("}")
		g.depth--
	case "list", "map":
		g.depth++
		n, l, i, e := fmt.Sprintf("n%d", g.depth), fmt.Sprintf("l%d", g.depth), fmt.Sprintf("i%d", g.depth), fmt.Sprintf("e%d", g.depth)
		if x.op == "list" {
			g.p("if %s := d.array(); %s == 0 {", n, n)
		} else {
			g.p("if %s := d.mapHeader(); %s == 0 {", n, n)
		}
		g.p("%s = nil", lv[0])
		g.p("} else {")
		el := x.args[0]
		g.p("%s := makeList[%s](&d, %s)", l, strings.TrimPrefix(g.t.goType(x), "[]"), n)
		g.p("for %s := range %s {", i, l)
		if el.op == "scalar" || el.op == "list" {
			g.dec(el, []string{l + "[" + i + "]"}, "d")
		} else {
			g.p("%s := &%s[%s]", e, l, i)
			if x.op == "list" {
				g.dec(el, []string{e}, "d")
			} else {
				s := g.t.structs[el.name]
				g.decElem(s.elems[0], e+".", false)
				if len(s.elems) == 2 {
					g.decElem(s.elems[1], e+".", false)
				} else {
					g.p("d.arrayN(%d)", len(s.elems)-1)
					for _, f := range s.elems[1:] {
						g.decElem(f, e+".", false)
					}
				}
			}
		}
		g.p("}")
		g.p("%s = %s", lv[0], l)
		g.p("}")
		g.depth--
	default:
		panic("dec " + x.op)
	}
}

func (g *gen) typeDecl(d *decl) {
	var wires []string
	for _, e := range d.elems {
		wires = append(wires, e.wire)
	}
	if d.packet {
		g.p("// %s is packet %#04x (%s): [%s].", d.name, d.code, d.kind, strings.Join(wires, ", "))
		if len(d.doc) > 0 {
			g.p("//")
		}
	}
	for _, l := range d.doc {
		if l == "" {
			g.p("//")
		} else {
			g.p("// %s", l)
		}
	}
	if len(d.elems) == 0 {
		g.p("type %s struct{}", d.name)
		return
	}
	g.p("type %s struct {", d.name)
	for _, e := range d.elems {
		types := g.t.slots(e.typ)
		k := 0
		for j, f := range e.order {
			typ := "bool"
			if f != e.flag {
				typ = types[k]
				k++
			}
			if j == 0 && e.comment != "" {
				g.p("%s %s // %s", f, typ, e.comment)
			} else {
				g.p("%s %s", f, typ)
			}
		}
	}
	g.p("}")
}

func (g *gen) packetMethods(d *decl) {
	g.p("func (*%s) Code() uint16 { return Code%s }", d.name, d.name)
	g.p("")
	g.p("func (m *%s) AppendArgs(b []byte) []byte {", d.name)
	g.p("b = %s", arrayHeader(len(d.elems)))
	g.encElems(d.elems, "m.")
	g.p("return b")
	g.p("}")
	g.p("")
	if d.split != "" {
		at := 0
		for i, e := range d.elems {
			if len(e.fields) == 1 && e.fields[0] == d.split {
				at = i
			}
		}
		g.p("// AppendArgsHead appends the arguments of m that precede the bytes of")
		g.p("// %s: m's arguments are AppendArgsHead, m.%s, AppendArgsTail.", d.split, d.split)
		g.p("func (m *%s) AppendArgsHead(b []byte) []byte {", d.name)
		g.p("b = %s", arrayHeader(len(d.elems)))
		g.encElems(d.elems[:at], "m.")
		g.p("b = msgp.AppendBinHeader(b, len(m.%s))", d.split)
		g.p("return b")
		g.p("}")
		g.p("")
		g.p("// AppendArgsTail appends the arguments of m that follow %s.", d.split)
		g.p("func (m *%s) AppendArgsTail(b []byte) []byte {", d.name)
		g.encElems(d.elems[at+1:], "m.")
		g.p("return b")
		g.p("}")
		g.p("")
	}
	g.p("func (m *%s) DecodeArgs(args []byte) error {", d.name)
	g.p("d := newDecoder(%q, args, %d)", d.name, len(d.elems))
	for _, e := range d.elems {
		g.decElem(e, "m.", true)
	}
	g.p("return d.finish()")
	g.p("}")
}

// Generate returns the Go source generated from the table src.
func Generate(src []byte) ([]byte, error) {
	t, err := parse(src)
	if err != nil {
		return nil, err
	}
	g := &gen{t: t}
	g.p("// Code generated by neo/proto/internal/protogen from packets.txt; DO NOT EDIT.")
	g.p("")
	g.p("package proto")
	g.p("")
	g.p("import (")
	g.p("%q", "github.com/zodbd/zodbd/neo/internal/msgp")
	g.p("%q", "github.com/zodbd/zodbd/zodb")
	g.p(")")
	g.p("")

	var packets []*decl
	for _, d := range t.decls {
		if d.packet {
			packets = append(packets, d)
		}
	}
	byCode := append([]*decl(nil), packets...)
	sort.Slice(byCode, func(i, j int) bool { return byCode[i].code < byCode[j].code })

	g.p("// Packet codes. An answer's code is its request's code | AnswerBit.")
	g.p("const (")
	for _, d := range byCode {
		g.p("Code%s uint16 = %#04x // %s", d.name, d.code, d.kind)
	}
	g.p(")")
	g.p("")
	g.p("// codeNames maps every code of protocol 5 to its NEO/py name.")
	g.p("var codeNames = map[uint16]string{")
	for _, d := range byCode {
		g.p("%#04x: %q,", d.code, d.name)
	}
	g.p("}")
	g.p("")
	g.p("// NewMsg returns a fresh zero packet of the given code, or false for an")
	g.p("// unknown code.")
	g.p("func NewMsg(code uint16) (Msg, bool) {")
	g.p("switch code {")
	for _, d := range byCode {
		g.p("case Code%s:", d.name)
		g.p("return new(%s), true", d.name)
	}
	g.p("}")
	g.p("return nil, false")
	g.p("}")
	for _, d := range t.decls {
		g.p("")
		g.typeDecl(d)
		if d.packet {
			g.p("")
			g.packetMethods(d)
		}
	}
	out, err := format.Source(g.b.Bytes())
	if err != nil {
		return nil, fmt.Errorf("protogen: generated code does not parse: %v\n%s", err, g.b.Bytes())
	}
	return out, nil
}
