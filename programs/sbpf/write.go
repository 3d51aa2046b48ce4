package sbpf

import (
	"debug/elf"
	"encoding/binary"
)

// layout is where each part of the output goes. Every allocated section's
// address is its file offset.
type layout struct {
	phnum       int
	textOff     uint64
	textSize    uint64
	rodataOff   uint64
	rodataSize  uint64
	rodataAlign uint64
	dataEnd     uint64 // end of .text/.rodata
}

// dynSymbols is .dynsym and .dynstr under construction: the null symbol, the
// entrypoint (exported, as Solana's linker does, so tools can find it), then
// the undefined symbols in order of first use.
type dynSymbols struct {
	strtab []byte
	syms   []dynSym
	byName map[string]int
}

type dynSym struct {
	name    uint32
	info    byte
	shndx   uint16
	value   uint64
	size    uint64
	defined bool
}

func newDynSymbols(entryName string, entry global) *dynSymbols {
	d := &dynSymbols{strtab: []byte{0}, byName: map[string]int{}}
	d.syms = append(d.syms, dynSym{})
	d.syms = append(d.syms, dynSym{name: d.str(entryName), info: elf.ST_INFO(elf.STB_GLOBAL, elf.STT_FUNC),
		value: entry.value, size: entry.size, defined: true})
	d.byName[entryName] = 1
	return d
}

func (d *dynSymbols) str(s string) uint32 {
	off := uint32(len(d.strtab))
	d.strtab = append(append(d.strtab, s...), 0)
	return off
}

// undefined returns the .dynsym index of an undefined (syscall) symbol. It is
// NOTYPE with value 0: the loader treats a relocated call as a syscall unless
// its symbol is a function with a nonzero value.
func (d *dynSymbols) undefined(name string) int {
	if i, ok := d.byName[name]; ok {
		return i
	}
	d.syms = append(d.syms, dynSym{name: d.str(name), info: elf.ST_INFO(elf.STB_GLOBAL, elf.STT_NOTYPE)})
	d.byName[name] = len(d.syms) - 1
	return len(d.syms) - 1
}

// section header under construction
type shdr struct {
	name            string
	typ             elf.SectionType
	flags           elf.SectionFlag
	addr, off, size uint64
	link, info      uint32
	align, entsize  uint64
	nameOff         uint32
}

func write(l layout, text, rodata []byte, dyn *dynSymbols, rels []dynReloc, entry uint64) []byte {
	le := binary.LittleEndian

	// Dynamic table: the loader reads DT_REL/DT_RELSZ/DT_RELENT and
	// DT_SYMTAB; DT_REL must be absent, not empty, when nothing is relocated.
	var tags []elf.DynTag
	if len(rels) > 0 {
		tags = append(tags, elf.DT_REL, elf.DT_RELSZ, elf.DT_RELENT)
	}
	tags = append(tags, elf.DT_SYMTAB, elf.DT_SYMENT, elf.DT_STRTAB, elf.DT_STRSZ, elf.DT_NULL)

	dynamicOff := alignUp(l.dataEnd, 8)
	dynamicSize := uint64(len(tags)) * 16
	dynsymOff := alignUp(dynamicOff+dynamicSize, 8)
	dynsymSize := uint64(len(dyn.syms)) * 24
	dynstrOff := dynsymOff + dynsymSize
	dynstrSize := uint64(len(dyn.strtab))
	relOff := alignUp(dynstrOff+dynstrSize, 8)
	relSize := uint64(len(rels)) * 16
	dynEnd := dynstrOff + dynstrSize
	if len(rels) > 0 {
		dynEnd = relOff + relSize
	}

	// Sections, in file order (the loader requires ascending offsets).
	secs := []*shdr{{}}
	add := func(s *shdr) uint32 { secs = append(secs, s); return uint32(len(secs) - 1) }
	textIdx := add(&shdr{name: ".text", typ: elf.SHT_PROGBITS, flags: elf.SHF_ALLOC | elf.SHF_EXECINSTR,
		addr: l.textOff, off: l.textOff, size: l.textSize, align: insnSize})
	if l.rodataSize > 0 {
		add(&shdr{name: ".rodata", typ: elf.SHT_PROGBITS, flags: elf.SHF_ALLOC,
			addr: l.rodataOff, off: l.rodataOff, size: l.rodataSize, align: l.rodataAlign})
	}
	dynamic := &shdr{name: ".dynamic", typ: elf.SHT_DYNAMIC, flags: elf.SHF_ALLOC,
		addr: dynamicOff, off: dynamicOff, size: dynamicSize, align: 8, entsize: 16}
	add(dynamic)
	dynsym := &shdr{name: ".dynsym", typ: elf.SHT_DYNSYM, flags: elf.SHF_ALLOC,
		addr: dynsymOff, off: dynsymOff, size: dynsymSize, align: 8, entsize: 24, info: 1}
	dynsymIdx := add(dynsym)
	dynstrIdx := add(&shdr{name: ".dynstr", typ: elf.SHT_STRTAB, flags: elf.SHF_ALLOC,
		addr: dynstrOff, off: dynstrOff, size: dynstrSize, align: 1})
	dynamic.link, dynsym.link = dynstrIdx, dynstrIdx
	if len(rels) > 0 {
		add(&shdr{name: ".rel.dyn", typ: elf.SHT_REL, flags: elf.SHF_ALLOC,
			addr: relOff, off: relOff, size: relSize, align: 8, entsize: 16, link: dynsymIdx})
	}
	shstrtab := &shdr{name: ".shstrtab", typ: elf.SHT_STRTAB, align: 1}
	shstrndx := add(shstrtab)
	names := []byte{0}
	for _, s := range secs[1:] {
		s.nameOff = uint32(len(names))
		names = append(append(names, s.name...), 0)
	}
	shstrtab.off = dynEnd
	shstrtab.size = uint64(len(names))
	shoff := alignUp(shstrtab.off+shstrtab.size, 8)
	out := make([]byte, shoff+uint64(len(secs))*64)

	// ELF header.
	copy(out, elf.ELFMAG)
	out[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	out[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	out[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	out[elf.EI_OSABI] = byte(elf.ELFOSABI_NONE)
	le.PutUint16(out[16:], uint16(elf.ET_DYN))
	le.PutUint16(out[18:], uint16(elf.EM_BPF))
	le.PutUint32(out[20:], uint32(elf.EV_CURRENT))
	le.PutUint64(out[24:], entry)
	le.PutUint64(out[32:], 64) // e_phoff
	le.PutUint64(out[40:], shoff)
	le.PutUint32(out[48:], 0) // e_flags 0: SBPFv0
	le.PutUint16(out[52:], 64)
	le.PutUint16(out[54:], 56)
	le.PutUint16(out[56:], uint16(l.phnum))
	le.PutUint16(out[58:], 64)
	le.PutUint16(out[60:], uint16(len(secs)))
	le.PutUint16(out[62:], uint16(shstrndx))

	// Program headers: PT_LOADs in ascending address order, then PT_DYNAMIC.
	ph := out[64:]
	phdr := func(typ elf.ProgType, flags elf.ProgFlag, off, size uint64) {
		le.PutUint32(ph[0:], uint32(typ))
		le.PutUint32(ph[4:], uint32(flags))
		le.PutUint64(ph[8:], off)
		le.PutUint64(ph[16:], off) // vaddr
		le.PutUint64(ph[24:], off) // paddr
		le.PutUint64(ph[32:], size)
		le.PutUint64(ph[40:], size)
		le.PutUint64(ph[48:], 8)
		ph = ph[56:]
	}
	phdr(elf.PT_LOAD, elf.PF_R|elf.PF_X, l.textOff, l.textSize)
	if l.rodataSize > 0 {
		phdr(elf.PT_LOAD, elf.PF_R, l.rodataOff, l.rodataSize)
	}
	phdr(elf.PT_LOAD, elf.PF_R, dynamicOff, dynEnd-dynamicOff)
	phdr(elf.PT_DYNAMIC, elf.PF_R, dynamicOff, dynamicSize)

	copy(out[l.textOff:], text)
	copy(out[l.rodataOff:], rodata)

	d := out[dynamicOff:]
	for _, tag := range tags {
		var v uint64
		switch tag {
		case elf.DT_REL:
			v = relOff
		case elf.DT_RELSZ:
			v = relSize
		case elf.DT_RELENT:
			v = 16
		case elf.DT_SYMTAB:
			v = dynsymOff
		case elf.DT_SYMENT:
			v = 24
		case elf.DT_STRTAB:
			v = dynstrOff
		case elf.DT_STRSZ:
			v = dynstrSize
		}
		le.PutUint64(d[0:], uint64(tag))
		le.PutUint64(d[8:], v)
		d = d[16:]
	}

	s := out[dynsymOff:]
	for _, sym := range dyn.syms {
		le.PutUint32(s[0:], sym.name)
		s[4] = sym.info
		if sym.defined {
			le.PutUint16(s[6:], uint16(textIdx))
		}
		le.PutUint64(s[8:], sym.value)
		le.PutUint64(s[16:], sym.size)
		s = s[24:]
	}
	copy(out[dynstrOff:], dyn.strtab)

	r := out[relOff:]
	for _, rel := range rels {
		le.PutUint64(r[0:], rel.offset)
		le.PutUint64(r[8:], uint64(rel.sym)<<32|rBPF64_32)
		r = r[16:]
	}
	copy(out[shstrtab.off:], names)

	sh := out[shoff:]
	for _, sec := range secs {
		le.PutUint32(sh[0:], sec.nameOff)
		le.PutUint32(sh[4:], uint32(sec.typ))
		le.PutUint64(sh[8:], uint64(sec.flags))
		le.PutUint64(sh[16:], sec.addr)
		le.PutUint64(sh[24:], sec.off)
		le.PutUint64(sh[32:], sec.size)
		le.PutUint32(sh[40:], sec.link)
		le.PutUint32(sh[44:], sec.info)
		le.PutUint64(sh[48:], sec.align)
		le.PutUint64(sh[56:], sec.entsize)
		sh = sh[64:]
	}
	return out
}
