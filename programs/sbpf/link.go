package sbpf

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ClangArgs are the compiler flags whose output Link accepts (docs/architecture.md §5):
// -mcpu=v2 because v3 emits JMP32 that the SBPFv0 verifier rejects and v4
// breaks on switch tables; 4096 bytes is SBPFv0's fixed stack frame. The
// build script uses the same flags; a test keeps the two in sync.
var ClangArgs = []string{
	"-target", "bpfel", "-mcpu=v2", "-O2", "-ffreestanding", "-fno-builtin",
	"-fPIC", "-mllvm", "-bpf-stack-size=4096", "-c",
}

// ProgramBase is where the loader maps the program's read-only bytes (.text
// and .rodata at their file offsets): MM_REGION_SIZE in solana-sbpf.
const ProgramBase = 0x1_0000_0000

// BPF relocation types (llvm/BinaryFormat/ELFRelocs/BPF.def).
const (
	rBPFNone       = 0
	rBPF64_64      = 1  // lddw: S + A in the two 32-bit immediates
	rBPF64Abs64    = 2  // 64-bit data word: S + A
	rBPF64Abs32    = 3  // 32-bit data word: S + A
	rBPF64NoDyld32 = 4  // .BTF/.BTF.ext only
	rBPF64_32      = 10 // call: (S + A) / 8 - 1
)

// Instruction encoding (solana-sbpf ebpf.rs).
const (
	insnSize   = 8
	opLddw     = 0x18
	opCall     = 0x85
	opCallx    = 0x8d
	classMask  = 0x07
	classJmp32 = 0x06
	maxAlign   = 4096
)

// Errors. Link wraps them with the object, section and symbol concerned.
var (
	ErrNotBPFObject   = errors.New("sbpf: not a 64-bit little-endian BPF relocatable object")
	ErrMutableGlobal  = errors.New("sbpf: writable data is not supported (programs have no mutable globals)")
	ErrUndefined      = errors.New("sbpf: undefined symbol")
	ErrDuplicate      = errors.New("sbpf: symbol defined more than once")
	ErrNoEntrypoint   = errors.New("sbpf: entrypoint function not defined")
	ErrBadRelocation  = errors.New("sbpf: unsupported relocation")
	ErrBadInstruction = errors.New("sbpf: instruction not accepted by SBPFv0")
)

// Object is one relocatable input: its name (for messages) and its bytes.
type Object struct {
	Name string
	Data []byte
}

// Option configures Link.
type Option func(*config) error

type config struct {
	entry    string
	entrySet bool
}

// WithEntry names the function the program starts at (default
// "entrypoint", the name Solana's tooling uses).
func WithEntry(name string) Option {
	return func(c *config) error {
		if c.entrySet {
			return errors.New("sbpf: WithEntry given twice")
		}
		if name == "" {
			return errors.New("sbpf: empty entry name")
		}
		c.entry, c.entrySet = name, true
		return nil
	}
}

// piece is one input section placed in an output section.
type piece struct {
	shndx   int
	name    string
	data    []byte // copy of the input bytes, patched in place
	align   uint64
	text    bool   // in .text, else in .rodata
	off     uint64 // offset inside its output section
	relSecs []*elf.Section
}

type input struct {
	name   string
	syms   []elf.Symbol // index i is symbol table index i+1
	pieces map[int]*piece
}

// dynReloc is a call to an undefined symbol left for the loader.
type dynReloc struct {
	offset uint64 // file offset (== vaddr) of the call instruction
	sym    int    // index in .dynsym
}

// Link turns relocatable objects into an SBPFv0 shared object.
func Link(objects []Object, opts ...Option) ([]byte, error) {
	cfg := config{}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if !cfg.entrySet {
		cfg.entry = "entrypoint"
	}
	if len(objects) == 0 {
		return nil, errors.New("sbpf: no input objects")
	}

	inputs, text, rodata, err := collect(objects)
	if err != nil {
		return nil, err
	}
	textSize := place(text)
	rodataSize := place(rodata)
	if textSize == 0 {
		return nil, errors.New("sbpf: no executable code in the inputs")
	}

	// File layout. Every allocated section's address equals its file offset,
	// which is what the v0 loader requires (sh_addr == sh_offset) and keeps
	// every address computation below a plain offset.
	l := layout{textSize: textSize, rodataSize: rodataSize}
	l.rodataAlign = 1
	for _, p := range rodata {
		l.rodataAlign = max(l.rodataAlign, p.align)
	}
	l.phnum = 3 // PT_LOAD .text, PT_LOAD dynamic data, PT_DYNAMIC
	if rodataSize > 0 {
		l.phnum++
	}
	l.textOff = alignUp(64+uint64(l.phnum)*56, insnSize)
	l.rodataOff = alignUp(l.textOff+textSize, max(l.rodataAlign, 8))
	end := l.textOff + textSize
	if rodataSize > 0 {
		end = l.rodataOff + rodataSize
	}
	l.dataEnd = end

	base := func(p *piece) uint64 {
		if p.text {
			return l.textOff + p.off
		}
		return l.rodataOff + p.off
	}

	globals, err := defineGlobals(inputs, base)
	if err != nil {
		return nil, err
	}
	entry, ok := globals[cfg.entry]
	if !ok || !entry.text {
		return nil, fmt.Errorf("%w: %q", ErrNoEntrypoint, cfg.entry)
	}

	// Resolve relocations; calls to undefined symbols become dynamic ones.
	dyn := newDynSymbols(cfg.entry, entry)
	var dynRels []dynReloc
	for _, in := range inputs {
		for _, p := range sortedPieces(in) {
			for _, rs := range p.relSecs {
				rels, err := relocate(in, p, rs, base, globals, l.textOff, textSize, dyn)
				if err != nil {
					return nil, err
				}
				dynRels = append(dynRels, rels...)
			}
		}
	}

	textBytes := make([]byte, textSize)
	for _, p := range text {
		copy(textBytes[p.off:], p.data)
	}
	if err := rewriteText(textBytes, l.textOff, dynRels); err != nil {
		return nil, err
	}
	rodataBytes := make([]byte, rodataSize)
	for _, p := range rodata {
		copy(rodataBytes[p.off:], p.data)
	}
	sort.Slice(dynRels, func(i, j int) bool { return dynRels[i].offset < dynRels[j].offset })
	return write(l, textBytes, rodataBytes, dyn, dynRels, entry.value), nil
}

// collect parses the objects and sorts their allocated sections into .text
// and .rodata pieces, refusing writable data.
func collect(objects []Object) ([]*input, []*piece, []*piece, error) {
	var inputs []*input
	var text, rodata []*piece
	for _, o := range objects {
		f, err := elf.NewFile(bytes.NewReader(o.Data))
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%s: %w: %v", o.Name, ErrNotBPFObject, err)
		}
		if f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB || f.Machine != elf.EM_BPF || f.Type != elf.ET_REL {
			return nil, nil, nil, fmt.Errorf("%s: %w (class %v, data %v, machine %v, type %v)",
				o.Name, ErrNotBPFObject, f.Class, f.Data, f.Machine, f.Type)
		}
		syms, err := f.Symbols()
		if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
			return nil, nil, nil, fmt.Errorf("%s: symbols: %w", o.Name, err)
		}
		in := &input{name: o.Name, syms: syms, pieces: map[int]*piece{}}
		for i, s := range f.Sections {
			if s.Flags&elf.SHF_ALLOC == 0 || s.Size == 0 {
				continue
			}
			readOnlyReloc := strings.HasPrefix(s.Name, ".data.rel.ro")
			switch {
			case s.Type == elf.SHT_PROGBITS && s.Flags&elf.SHF_EXECINSTR != 0:
			case s.Type == elf.SHT_PROGBITS && (s.Flags&elf.SHF_WRITE == 0 || readOnlyReloc):
				// .data.rel.ro is writable only so that a dynamic linker
				// could patch it; every relocation in it is resolved here,
				// so at run time it is as read-only as .rodata.
			default:
				return nil, nil, nil, fmt.Errorf("%s: section %s: %w (symbols: %s)",
					o.Name, s.Name, ErrMutableGlobal, symbolsIn(syms, i))
			}
			// The loader maps sections at their offsets, so alignment is
			// honoured by padding; refuse alignments no sane object has
			// rather than padding by gigabytes.
			if s.Addralign > maxAlign || s.Addralign&(s.Addralign-1) != 0 {
				return nil, nil, nil, fmt.Errorf("%s: section %s: alignment %d not supported", o.Name, s.Name, s.Addralign)
			}
			data, err := s.Data()
			if err != nil {
				return nil, nil, nil, fmt.Errorf("%s: section %s: %w", o.Name, s.Name, err)
			}
			p := &piece{shndx: i, name: s.Name, data: data, align: max(s.Addralign, 1),
				text: s.Flags&elf.SHF_EXECINSTR != 0}
			if p.text {
				if len(data)%insnSize != 0 {
					return nil, nil, nil, fmt.Errorf("%s: section %s: size %d is not whole instructions",
						o.Name, s.Name, len(data))
				}
				p.align = max(p.align, insnSize)
				text = append(text, p)
			} else {
				rodata = append(rodata, p)
			}
			in.pieces[i] = p
		}
		for _, s := range f.Sections {
			if s.Type != elf.SHT_REL && s.Type != elf.SHT_RELA {
				continue
			}
			p, ok := in.pieces[int(s.Info)]
			if !ok {
				continue // relocations of debug info, BTF or dropped sections
			}
			if s.Type == elf.SHT_RELA {
				return nil, nil, nil, fmt.Errorf("%s: section %s: %w: BPF objects use REL, not RELA",
					o.Name, s.Name, ErrBadRelocation)
			}
			p.relSecs = append(p.relSecs, s)
		}
		inputs = append(inputs, in)
	}
	return inputs, text, rodata, nil
}

// symbolsIn names the symbols defined in section shndx, for error messages.
func symbolsIn(syms []elf.Symbol, shndx int) string {
	var names []string
	for _, s := range syms {
		if int(s.Section) == shndx && s.Name != "" && elf.ST_TYPE(s.Info) != elf.STT_SECTION {
			names = append(names, s.Name)
		}
	}
	if len(names) == 0 {
		return "none named"
	}
	return strings.Join(names, ", ")
}

// place assigns each piece its offset in the output section and returns the
// section's size.
func place(pieces []*piece) uint64 {
	var off uint64
	for _, p := range pieces {
		off = alignUp(off, p.align)
		p.off = off
		off += uint64(len(p.data))
	}
	return off
}

func sortedPieces(in *input) []*piece {
	ps := make([]*piece, 0, len(in.pieces))
	for _, p := range in.pieces {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].shndx < ps[j].shndx })
	return ps
}

// global is a resolved global symbol.
type global struct {
	value uint64 // vaddr
	size  uint64
	text  bool
	fn    bool
}

func defineGlobals(inputs []*input, base func(*piece) uint64) (map[string]global, error) {
	globals := map[string]global{}
	where := map[string]string{}
	for _, in := range inputs {
		for _, s := range in.syms {
			bind := elf.ST_BIND(s.Info)
			if bind != elf.STB_GLOBAL && bind != elf.STB_WEAK {
				continue
			}
			if s.Section == elf.SHN_COMMON {
				return nil, fmt.Errorf("%s: %s: %w (a tentative definition)", in.name, s.Name, ErrMutableGlobal)
			}
			if s.Section == elf.SHN_UNDEF {
				continue
			}
			p, ok := in.pieces[int(s.Section)]
			if !ok {
				if s.Section == elf.SHN_ABS {
					return nil, fmt.Errorf("%s: %s: %w: absolute symbols", in.name, s.Name, ErrBadRelocation)
				}
				continue // defined in a dropped (non-allocated) section
			}
			if prev, dup := where[s.Name]; dup {
				return nil, fmt.Errorf("%w: %s in %s and %s", ErrDuplicate, s.Name, prev, in.name)
			}
			where[s.Name] = in.name
			globals[s.Name] = global{value: base(p) + s.Value, size: s.Size, text: p.text,
				fn: elf.ST_TYPE(s.Info) == elf.STT_FUNC}
		}
	}
	return globals, nil
}

// resolve returns the vaddr of symbol index idx (1-based, as in r_info) of in,
// or ok=false and its name when it is undefined in every input.
func resolve(in *input, idx uint32, base func(*piece) uint64, globals map[string]global) (uint64, string, bool, error) {
	if idx == 0 || int(idx) > len(in.syms) {
		return 0, "", false, fmt.Errorf("%s: %w: symbol index %d out of range", in.name, ErrBadRelocation, idx)
	}
	s := in.syms[idx-1]
	if s.Section == elf.SHN_UNDEF {
		if g, ok := globals[s.Name]; ok {
			return g.value, s.Name, true, nil
		}
		return 0, s.Name, false, nil
	}
	p, ok := in.pieces[int(s.Section)]
	if !ok {
		return 0, s.Name, false, fmt.Errorf("%s: %w: symbol %q is in a section that is not linked",
			in.name, ErrBadRelocation, s.Name)
	}
	if elf.ST_TYPE(s.Info) == elf.STT_SECTION {
		return base(p), p.name, true, nil
	}
	return base(p) + s.Value, s.Name, true, nil
}

// relocate applies the relocations of one section to its piece and returns
// the dynamic relocations it leaves for the loader.
func relocate(in *input, p *piece, rs *elf.Section, base func(*piece) uint64, globals map[string]global,
	textOff, textSize uint64, dyn *dynSymbols) ([]dynReloc, error) {
	raw, err := rs.Data()
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", in.name, rs.Name, err)
	}
	if len(raw)%16 != 0 {
		return nil, fmt.Errorf("%s: %s: %w: size %d is not whole entries", in.name, rs.Name, ErrBadRelocation, len(raw))
	}
	var out []dynReloc
	le := binary.LittleEndian
	for i := 0; i < len(raw); i += 16 {
		off := le.Uint64(raw[i:])
		info := le.Uint64(raw[i+8:])
		typ, symIdx := uint32(info), uint32(info>>32)
		where := fmt.Sprintf("%s: %s+%#x", in.name, p.name, off)
		if typ == rBPFNone {
			continue
		}
		S, name, defined, err := resolve(in, symIdx, base, globals)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		switch typ {
		case rBPF64_64:
			if !p.text || off%insnSize != 0 || off+2*insnSize > uint64(len(p.data)) || p.data[off] != opLddw {
				return nil, fmt.Errorf("%s: %w: R_BPF_64_64 not on an lddw", where, ErrBadRelocation)
			}
			if !defined {
				return nil, fmt.Errorf("%s: %w: %s (address taken)", where, ErrUndefined, name)
			}
			if hi := le.Uint32(p.data[off+12:]); hi != 0 {
				return nil, fmt.Errorf("%s: %w: lddw addend has high bits %#x", where, ErrBadRelocation, hi)
			}
			v := uint64(ProgramBase + int64(S) + int64(int32(le.Uint32(p.data[off+4:]))))
			le.PutUint32(p.data[off+4:], uint32(v))
			le.PutUint32(p.data[off+12:], uint32(v>>32))
		case rBPF64Abs64:
			if p.text || off+8 > uint64(len(p.data)) {
				return nil, fmt.Errorf("%s: %w: R_BPF_64_ABS64 outside read-only data", where, ErrBadRelocation)
			}
			if !defined {
				return nil, fmt.Errorf("%s: %w: %s (address stored in data)", where, ErrUndefined, name)
			}
			le.PutUint64(p.data[off:], ProgramBase+S+le.Uint64(p.data[off:]))
		case rBPF64_32:
			if !p.text || off%insnSize != 0 || off+insnSize > uint64(len(p.data)) || p.data[off] != opCall {
				return nil, fmt.Errorf("%s: %w: R_BPF_64_32 not on a call", where, ErrBadRelocation)
			}
			imm := int64(int32(le.Uint32(p.data[off+4:])))
			pc := int64(base(p)+off-textOff) / insnSize
			if !defined {
				// A syscall: the loader hashes the name into imm. imm must be
				// -1, or the loader takes the call for a pc-relative one.
				if !knownSyscalls[name] {
					return nil, fmt.Errorf("%s: %w: %s is neither defined nor a Solana syscall", where, ErrUndefined, name)
				}
				if imm != -1 {
					return nil, fmt.Errorf("%s: %w: call to undefined %s has addend %d", where, ErrBadRelocation, name, imm)
				}
				p.data[off+1] = 0 // dst 0, src 0: an external call
				out = append(out, dynReloc{offset: base(p) + off, sym: dyn.undefined(name)})
				continue
			}
			// The implicit addend counts instructions past the symbol, minus
			// one: a call to the symbol itself carries imm -1.
			target := int64(S) + (imm+1)*insnSize
			if target < int64(textOff) || target >= int64(textOff+textSize) || (target-int64(textOff))%insnSize != 0 {
				return nil, fmt.Errorf("%s: %w: call target %s%+d is not in .text", where, ErrBadRelocation, name, (imm+1)*insnSize)
			}
			rel := (target-int64(textOff))/insnSize - pc - 1
			p.data[off+1] = 1 << 4 // src 1: a pc-relative call
			le.PutUint32(p.data[off+4:], uint32(int32(rel)))
		case rBPF64Abs32:
			return nil, fmt.Errorf("%s: %w: R_BPF_64_ABS32 to %s: addresses at %#x do not fit 32 bits",
				where, ErrBadRelocation, name, ProgramBase)
		case rBPF64NoDyld32:
			return nil, fmt.Errorf("%s: %w: R_BPF_64_NODYLD32 (BTF) in an allocated section", where, ErrBadRelocation)
		default:
			return nil, fmt.Errorf("%s: %w: type %d", where, ErrBadRelocation, typ)
		}
	}
	return out, nil
}

// rewriteText fixes the instructions that upstream LLVM and SBPFv0 encode
// differently and checks those SBPFv0 cannot run.
func rewriteText(text []byte, textOff uint64, dynRels []dynReloc) error {
	syscalls := map[uint64]bool{}
	for _, r := range dynRels {
		syscalls[r.offset] = true
	}
	n := len(text) / insnSize
	for i := 0; i < n; i++ {
		insn := text[i*insnSize : (i+1)*insnSize]
		op := insn[0]
		switch {
		case op == opLddw:
			i++ // the second half is not an instruction
		case op == opCallx:
			// Upstream puts the register in dst; SBPFv0 reads it from imm.
			dst := insn[1] & 0x0f
			imm := binary.LittleEndian.Uint32(insn[4:])
			if dst != 0 && imm != 0 {
				return fmt.Errorf("%w: callx at %#x has both dst r%d and imm %d", ErrBadInstruction, textOff+uint64(i*insnSize), dst, imm)
			}
			if dst != 0 {
				insn[1] &^= 0x0f
				binary.LittleEndian.PutUint32(insn[4:], uint32(dst))
			}
		case op == opCall:
			imm := int32(binary.LittleEndian.Uint32(insn[4:]))
			at := textOff + uint64(i*insnSize)
			if syscalls[at] {
				continue // bound by the loader through its dynamic relocation
			}
			if imm == -1 {
				// The loader takes imm -1 for "syscall, see relocation":
				// a function calling itself cannot be encoded in SBPFv0.
				return fmt.Errorf("%w: call at %#x calls itself (direct recursion)", ErrBadInstruction, at)
			}
			// A pc-relative call (resolved by the assembler or by relocate):
			// the loader rejects targets outside .text, so say where.
			if t := i + 1 + int(imm); t < 0 || t >= n {
				return fmt.Errorf("%w: call at %#x jumps outside .text", ErrBadInstruction, at)
			}
		case op&classMask == classJmp32:
			return fmt.Errorf("%w: JMP32 opcode %#02x at %#x (compile with -mcpu=v2)", ErrBadInstruction, op, textOff+uint64(i*insnSize))
		}
	}
	return nil
}

func alignUp(v, a uint64) uint64 {
	if a <= 1 {
		return v
	}
	return (v + a - 1) / a * a
}
