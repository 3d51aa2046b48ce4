package sbpf

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The test programs live in testdata/NAME/*.c with their committed objects
// (NAME/*.o) and linked programs (NAME.so); scripts/build-program --testdata
// rebuilds all three. bad_* programs must not link.

func readObjects(t testing.TB, name string) []Object {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", name, "*.o"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no objects in testdata/%s (%v)", name, err)
	}
	slices.Sort(paths) // the build script links in C-locale glob order
	var objs []Object
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, Object{Name: p, Data: data})
	}
	return objs
}

func link(t testing.TB, name string, opts ...Option) []byte {
	t.Helper()
	so, err := Link(readObjects(t, name), opts...)
	if err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	return so
}

// program is a linked shared object taken apart with debug/elf, independently
// of the code that wrote it.
type program struct {
	f        *elf.File
	raw      []byte
	text     *elf.Section
	rodata   *elf.Section // nil when there is none
	dynamic  map[elf.DynTag]uint64
	dynOrder []elf.DynTag
	dynsyms  []elf.Symbol
	rels     []rel
}

type rel struct {
	offset uint64
	typ    uint32
	sym    string
}

func parse(t *testing.T, so []byte) *program {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(so))
	if err != nil {
		t.Fatalf("debug/elf cannot read the output: %v", err)
	}
	p := &program{f: f, raw: so, dynamic: map[elf.DynTag]uint64{}}
	p.text = f.Section(".text")
	p.rodata = f.Section(".rodata")
	if p.text == nil {
		t.Fatal("no .text")
	}
	if d := f.Section(".dynamic"); d != nil {
		data, _ := d.Data()
		for i := 0; i+16 <= len(data); i += 16 {
			tag := elf.DynTag(binary.LittleEndian.Uint64(data[i:]))
			p.dynOrder = append(p.dynOrder, tag)
			if tag == elf.DT_NULL {
				break
			}
			p.dynamic[tag] = binary.LittleEndian.Uint64(data[i+8:])
		}
	}
	p.dynsyms, err = f.DynamicSymbols()
	if err != nil {
		t.Fatalf("dynamic symbols: %v", err)
	}
	if r := f.Section(".rel.dyn"); r != nil {
		data, _ := r.Data()
		for i := 0; i+16 <= len(data); i += 16 {
			info := binary.LittleEndian.Uint64(data[i+8:])
			sym := int(info >> 32)
			if sym < 1 || sym > len(p.dynsyms) {
				t.Fatalf("relocation %d: symbol index %d out of range", i/16, sym)
			}
			p.rels = append(p.rels, rel{binary.LittleEndian.Uint64(data[i:]), uint32(info), p.dynsyms[sym-1].Name})
		}
	}
	return p
}

// insn is one decoded instruction of .text; lddw takes two slots and carries
// its 64-bit immediate.
type insn struct {
	pc       int // slot index from the start of .text
	addr     uint64
	op, dst  byte
	src      byte
	imm      int32
	imm64    uint64
	wideLoad bool
}

func (p *program) insns(t *testing.T) []insn {
	t.Helper()
	data, err := p.text.Data()
	if err != nil {
		t.Fatal(err)
	}
	var out []insn
	for pc := 0; pc*8 < len(data); pc++ {
		b := data[pc*8:]
		in := insn{pc: pc, addr: p.text.Addr + uint64(pc*8), op: b[0], dst: b[1] & 0xf, src: b[1] >> 4,
			imm: int32(binary.LittleEndian.Uint32(b[4:]))}
		if in.op == opLddw {
			in.wideLoad = true
			in.imm64 = uint64(binary.LittleEndian.Uint32(b[4:])) | uint64(binary.LittleEndian.Uint32(b[12:]))<<32
			out = append(out, in)
			pc++
			continue
		}
		out = append(out, in)
	}
	return out
}

// checkLoaderRules asserts what solana-sbpf's v0 loader requires of every
// program (docs/architecture.md §5), whatever the program.
func checkLoaderRules(t *testing.T, p *program) {
	t.Helper()
	h := p.raw
	le := binary.LittleEndian
	if p.f.Type != elf.ET_DYN || p.f.Machine != elf.EM_BPF || p.f.OSABI != elf.ELFOSABI_NONE || p.f.Class != elf.ELFCLASS64 {
		t.Errorf("header: type %v machine %v abi %v class %v", p.f.Type, p.f.Machine, p.f.OSABI, p.f.Class)
	}
	if flags := le.Uint32(h[48:]); flags != 0 {
		t.Errorf("e_flags = %d, want 0 (SBPFv0)", flags)
	}
	if ehsize, phentsize, shentsize := le.Uint16(h[52:]), le.Uint16(h[54:]), le.Uint16(h[58:]); ehsize != 64 || phentsize != 56 || shentsize != 64 {
		t.Errorf("header sizes %d/%d/%d, want 64/56/64", ehsize, phentsize, shentsize)
	}
	if phoff := le.Uint64(h[32:]); phoff != 64 {
		t.Errorf("e_phoff = %d, want 64", phoff)
	}
	if p.f.Sections[0].Type != elf.SHT_NULL {
		t.Error("section 0 is not SHT_NULL")
	}
	texts, end := 0, uint64(0)
	for _, s := range p.f.Sections[1:] {
		if s.Name == ".text" {
			texts++
		}
		if strings.HasPrefix(s.Name, ".bss") || strings.HasPrefix(s.Name, ".data") || s.Flags&elf.SHF_WRITE != 0 {
			t.Errorf("section %s: writable data", s.Name)
		}
		if s.Flags&elf.SHF_ALLOC != 0 && s.Addr != s.Offset {
			t.Errorf("section %s: sh_addr %#x != sh_offset %#x", s.Name, s.Addr, s.Offset)
		}
		if s.Offset < end {
			t.Errorf("section %s at %#x overlaps or precedes the one before (ends %#x)", s.Name, s.Offset, end)
		}
		end = s.Offset + s.Size
		if end > uint64(len(h)) {
			t.Errorf("section %s runs past the file", s.Name)
		}
	}
	if texts != 1 {
		t.Errorf("%d .text sections, want exactly 1", texts)
	}
	if p.f.Entry < p.text.Addr || p.f.Entry >= p.text.Addr+p.text.Size || (p.f.Entry-p.text.Addr)%8 != 0 {
		t.Errorf("entry %#x not an instruction of .text [%#x, %#x)", p.f.Entry, p.text.Addr, p.text.Addr+p.text.Size)
	}
	var lastLoad uint64
	for _, ph := range p.f.Progs {
		if ph.Type == elf.PT_LOAD {
			if ph.Vaddr < lastLoad {
				t.Error("PT_LOAD segments not in ascending order")
			}
			lastLoad = ph.Vaddr
		}
	}

	// Dynamic table: DT_REL only with relocations (RELSZ 0 is rejected).
	if len(p.rels) > 0 {
		if p.dynamic[elf.DT_RELSZ] != uint64(16*len(p.rels)) || p.dynamic[elf.DT_RELENT] != 16 {
			t.Errorf("DT_RELSZ %d DT_RELENT %d for %d relocations", p.dynamic[elf.DT_RELSZ], p.dynamic[elf.DT_RELENT], len(p.rels))
		}
		if r := p.f.Section(".rel.dyn"); r == nil || r.Addr != p.dynamic[elf.DT_REL] {
			t.Errorf("DT_REL %#x does not point at .rel.dyn", p.dynamic[elf.DT_REL])
		}
	} else {
		for _, tag := range []elf.DynTag{elf.DT_REL, elf.DT_RELSZ, elf.DT_RELENT} {
			if _, ok := p.dynamic[tag]; ok {
				t.Errorf("%v present without relocations", tag)
			}
		}
	}
	if ds := p.f.Section(".dynsym"); ds == nil || ds.Addr != p.dynamic[elf.DT_SYMTAB] {
		t.Errorf("DT_SYMTAB %#x does not point at .dynsym", p.dynamic[elf.DT_SYMTAB])
	}
	if p.f.Section(".dynstr") == nil {
		t.Error("no .dynstr")
	}
	if p.dynOrder[len(p.dynOrder)-1] != elf.DT_NULL {
		t.Error("dynamic table not terminated by DT_NULL")
	}

	// Every dynamic relocation is a syscall: R_BPF_64_32 on a call with
	// imm -1 to an undefined symbol.
	code := p.insns(t)
	byAddr := map[uint64]insn{}
	for _, in := range code {
		byAddr[in.addr] = in
	}
	for _, r := range p.rels {
		in, ok := byAddr[r.offset]
		if r.typ != rBPF64_32 || !ok || in.op != opCall || in.imm != -1 || in.src != 0 {
			t.Errorf("relocation %+v: not R_BPF_64_32 on a syscall call (insn %+v)", r, in)
		}
	}
	relocated := map[uint64]bool{}
	for _, r := range p.rels {
		relocated[r.offset] = true
	}
	textEnd := p.text.Addr + p.text.Size
	for _, in := range code {
		switch {
		case in.op == opCall && !relocated[in.addr]:
			target := in.pc + 1 + int(in.imm)
			if in.src != 1 || target < 0 || uint64(target*8) >= p.text.Size {
				t.Errorf("call at %#x: src %d target pc %d, want src 1 and a pc in .text", in.addr, in.src, target)
			}
		case in.op == opCallx:
			if in.dst != 0 || in.imm < 0 || in.imm > 9 {
				t.Errorf("callx at %#x: dst r%d imm %d, want the register in imm", in.addr, in.dst, in.imm)
			}
		case in.wideLoad && in.imm64 >= ProgramBase:
			// Every address is inside the mapped read-only region.
			a := in.imm64 - ProgramBase
			inText := a >= p.text.Addr && a < textEnd
			inRodata := p.rodata != nil && a >= p.rodata.Addr && a <= p.rodata.Addr+p.rodata.Size
			if !inText && !inRodata {
				t.Errorf("lddw at %#x loads %#x, outside .text and .rodata", in.addr, in.imm64)
			}
		case in.op&classMask == classJmp32:
			t.Errorf("JMP32 instruction at %#x", in.addr)
		}
	}
}

// symbolValue is the value of a symbol in one of the input objects.
func symbolValue(t *testing.T, obj Object, name string) (uint64, uint64) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(obj.Data))
	if err != nil {
		t.Fatal(err)
	}
	syms, _ := f.Symbols()
	for _, s := range syms {
		if s.Name == name {
			return s.Value, s.Size
		}
	}
	t.Fatalf("%s: no symbol %s", obj.Name, name)
	return 0, 0
}

func textSize(t *testing.T, obj Object) uint64 {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(obj.Data))
	if err != nil {
		t.Fatal(err)
	}
	return f.Section(".text").Size
}

func TestLink(t *testing.T) {
	tests := []struct {
		name     string
		syscalls []string // dynamic relocations, in address order
		rodata   [][]byte // byte strings the merged .rodata must hold
		check    func(t *testing.T, p *program, objs []Object)
	}{{
		name:     "syscall",
		syscalls: []string{"sol_log_"},
		rodata:   [][]byte{[]byte("hello from sbpf")},
		check: func(t *testing.T, p *program, _ []Object) {
			// The message is an lddw of 0x1_0000_0000 + its address.
			want := ProgramBase + p.rodata.Addr + uint64(bytes.Index(rodataBytes(t, p), []byte("hello from sbpf")))
			if !slices.ContainsFunc(p.insns(t), func(in insn) bool { return in.wideLoad && in.imm64 == want }) {
				t.Errorf("no lddw of the message address %#x", want)
			}
		},
	}, {
		name:     "rodata",
		syscalls: []string{"sol_log_", "sol_log_64_"},
		rodata:   [][]byte{[]byte("rodata: sum of primes"), le64s(2, 3, 5, 7, 11, 13, 17, 19)},
		check: func(t *testing.T, p *program, _ []Object) {
			table := ProgramBase + p.rodata.Addr + uint64(bytes.Index(rodataBytes(t, p), le64s(2, 3, 5, 7)))
			if !slices.ContainsFunc(p.insns(t), func(in insn) bool { return in.wideLoad && in.imm64 == table }) {
				t.Errorf("no lddw of the table address %#x", table)
			}
		},
	}, {
		name:     "call",
		syscalls: []string{"sol_log_64_"},
		check: func(t *testing.T, p *program, objs []Object) {
			// callee.o's .text comes first, main.o's after it (8-aligned).
			callee, main := objs[0], objs[1]
			mainBase := p.text.Addr + (textSize(t, callee)+7)/8*8
			mix, _ := symbolValue(t, callee, "mix")
			square, _ := symbolValue(t, main, "square")
			times31, _ := symbolValue(t, callee, "times31")
			entry, _ := symbolValue(t, main, "entrypoint")
			if p.f.Entry != mainBase+entry {
				t.Errorf("entry %#x, want entrypoint at %#x", p.f.Entry, mainBase+entry)
			}
			targets := callTargets(t, p)
			for name, want := range map[string]uint64{
				"mix (other object)": p.text.Addr + mix, "square (assembler-resolved)": mainBase + square,
				"times31 (in callee)": p.text.Addr + times31,
			} {
				if !slices.Contains(targets, want) {
					t.Errorf("no call to %s at %#x; calls go to %#x", name, want, targets)
				}
			}
		},
	}, {
		name:     "fnptr",
		syscalls: []string{"sol_log_64_"},
		check: func(t *testing.T, p *program, objs []Object) {
			// The const table holds the absolute addresses of add, sub, mul.
			var want []uint64
			for _, fn := range []string{"add", "sub", "mul"} {
				v, _ := symbolValue(t, objs[0], fn)
				want = append(want, ProgramBase+p.text.Addr+v)
			}
			if !bytes.Contains(rodataBytes(t, p), le64s(want...)) {
				t.Errorf("rodata %x does not hold the function table %#x", rodataBytes(t, p), want)
			}
			// add's address also comes from an lddw (volatile f = add).
			if !slices.ContainsFunc(p.insns(t), func(in insn) bool { return in.wideLoad && in.imm64 == want[0] }) {
				t.Errorf("no lddw of add's address %#x", want[0])
			}
			n := 0
			for _, in := range p.insns(t) {
				if in.op == opCallx {
					n++
				}
			}
			if n != 4 {
				t.Errorf("%d callx, want 4", n)
			}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := readObjects(t, tt.name)
			so := link(t, tt.name)
			p := parse(t, so)
			checkLoaderRules(t, p)
			var got []string
			for _, r := range p.rels {
				got = append(got, r.sym)
			}
			if !slices.Equal(got, tt.syscalls) {
				t.Errorf("dynamic relocations %q, want %q", got, tt.syscalls)
			}
			if len(tt.rodata) > 0 && p.rodata == nil {
				t.Fatal("no .rodata")
			}
			for _, want := range tt.rodata {
				if !bytes.Contains(rodataBytes(t, p), want) {
					t.Errorf(".rodata lacks %q", want)
				}
			}
			var dyn []string
			for _, s := range p.dynsyms {
				dyn = append(dyn, s.Name)
			}
			if dyn[0] != "entrypoint" {
				t.Errorf("dynamic symbols %q, want entrypoint first", dyn)
			}
			if tt.check != nil {
				tt.check(t, p, objs)
			}
		})
	}
}

func rodataBytes(t *testing.T, p *program) []byte {
	t.Helper()
	if p.rodata == nil {
		t.Fatal("no .rodata")
	}
	b, err := p.rodata.Data()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func le64s(vs ...uint64) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b
}

// callTargets lists the addresses of internal (pc-relative) calls.
func callTargets(t *testing.T, p *program) []uint64 {
	var out []uint64
	for _, in := range p.insns(t) {
		if in.op == opCall && in.src == 1 {
			out = append(out, p.text.Addr+uint64(in.pc+1+int(in.imm))*8)
		}
	}
	return out
}

// TestLinkGolden pins the linker's output: the committed NAME.so must be what
// linking the committed objects gives (they were run on litesvm's loader
// when they were made: see the validator tests).
func TestLinkGolden(t *testing.T) {
	for _, name := range []string{"syscall", "rodata", "call", "fnptr"} {
		t.Run(name, func(t *testing.T) {
			want, err := os.ReadFile(filepath.Join("testdata", name+".so"))
			if err != nil {
				t.Fatal(err)
			}
			if got := link(t, name); !bytes.Equal(got, want) {
				t.Errorf("linking testdata/%s/*.o differs from testdata/%s.so; if the change is intended run scripts/build-program --testdata", name, name)
			}
		})
	}
}

// patchText returns a copy of obj with fn applied to its .text bytes.
func patchText(t *testing.T, obj Object, fn func(text []byte)) Object {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(obj.Data))
	if err != nil {
		t.Fatal(err)
	}
	s := f.Section(".text")
	data := bytes.Clone(obj.Data)
	fn(data[s.Offset : s.Offset+s.Size])
	return Object{Name: obj.Name + " (patched)", Data: data}
}

func TestLinkErrors(t *testing.T) {
	hello := readObjects(t, "syscall")[0]
	call := readObjects(t, "call")
	tests := []struct {
		name    string
		objects []Object
		opts    []Option
		want    error
		mention string
	}{
		{"mutable global", readObjects(t, "bad_mutable"), nil, ErrMutableGlobal, "counter"},
		{"undefined function", readObjects(t, "bad_undefined"), nil, ErrUndefined, "memcpy"},
		{"missing entrypoint", []Object{hello}, []Option{WithEntry("main")}, ErrNoEntrypoint, "main"},
		{"duplicate definition", append(slices.Clone(call), call[0]), nil, ErrDuplicate, "mix"},
		{"not an object", []Object{{Name: "junk", Data: []byte("not an ELF file")}}, nil, ErrNotBPFObject, "junk"},
		{"a linked program is not an object", []Object{{Name: "so", Data: link(t, "syscall")}}, nil, ErrNotBPFObject, "type ET_DYN"},
		{"JMP32 (-mcpu=v3)", []Object{patchText(t, hello, func(text []byte) {
			text[len(text)-8] = 0x16 // exit -> jeq32 imm
		})}, nil, ErrBadInstruction, "JMP32"},
		{"direct recursion", []Object{call[0], patchText(t, call[1], func(text []byte) {
			// main.o's call to square is assembler-resolved; make it -1.
			for i := 0; i < len(text); i += 8 {
				if text[i] == opCall && int32(binary.LittleEndian.Uint32(text[i+4:])) > 0 {
					binary.LittleEndian.PutUint32(text[i+4:], 0xffffffff)
					return
				}
			}
			t.Fatal("no resolved call in main.o")
		})}, nil, ErrBadInstruction, "calls itself"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Link(tt.objects, tt.opts...)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("Link: %v, want %v mentioning %q", err, tt.want, tt.mention)
			}
		})
	}
	if _, err := Link([]Object{hello}, WithEntry("a"), WithEntry("b")); err == nil {
		t.Error("WithEntry twice accepted")
	}
	if _, err := Link(nil); err == nil {
		t.Error("no objects accepted")
	}
}

// TestClangArgsMatchBuildScript keeps the flags in scripts/build-program and
// ClangArgs (used by TestRecompileTestdata) the same.
func TestClangArgsMatchBuildScript(t *testing.T) {
	script, err := os.ReadFile("../../scripts/build-program")
	if err != nil {
		t.Fatal(err)
	}
	want := "CFLAGS=(" + strings.Join(ClangArgs, " ") + ")"
	if !strings.Contains(string(script), want) {
		t.Errorf("scripts/build-program does not set %s", want)
	}
}

// TestRecompileTestdata checks that the committed objects are what the
// pinned compiler makes of the committed sources, so the sources and the
// objects the other tests read cannot drift apart.
func TestRecompileTestdata(t *testing.T) {
	clang, err := exec.LookPath("clang-22")
	if err != nil {
		t.Skip("clang-22 is not installed (apt-get install -y clang-22): the committed objects are not recompiled")
	}
	sources, err := filepath.Glob(filepath.Join("testdata", "*", "*.c"))
	if err != nil || len(sources) == 0 {
		t.Fatalf("no test sources (%v)", err)
	}
	tmp := t.TempDir()
	for _, src := range sources {
		dir, file := filepath.Split(src)
		out := filepath.Join(tmp, strings.ReplaceAll(strings.TrimSuffix(src, ".c"), string(filepath.Separator), "_")+".o")
		// Compile by bare name from the source's directory, as the build
		// script does: the object records the file name it was given.
		cmd := exec.Command(clang, append(slices.Clone(ClangArgs), file, "-o", out)...)
		cmd.Dir = dir
		if msg, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", src, err, msg)
		}
		got, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(strings.TrimSuffix(src, ".c") + ".o")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s compiles to different bytes than the committed object; run scripts/build-program --testdata", src)
		}
	}
}
