//go:build amd64 && !purego

#include "textflag.h"

// func cpuid(eax, ecx uint32) (a, b, c, d uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL eax+0(FP), AX
	MOVL ecx+4(FP), CX
	CPUID
	MOVL AX, a+8(FP)
	MOVL BX, b+12(FP)
	MOVL CX, c+16(FP)
	MOVL DX, d+20(FP)
	RET

// func xgetbv() uint32
TEXT ·xgetbv(SB), NOSPLIT, $0-4
	MOVL $0, CX
	XGETBV
	MOVL AX, ret+0(FP)
	RET

// func butterflyAVX2(u, v, a, b *float32, n int, gain float32)
// u = a + b; v = (a - b) * g
TEXT ·butterflyAVX2(SB), NOSPLIT, $0-44
	MOVQ u+0(FP), DI
	MOVQ v+8(FP), SI
	MOVQ a+16(FP), AX
	MOVQ b+24(FP), BX
	MOVQ n+32(FP), CX
	VBROADCASTSS gain+40(FP), Y7
	XORQ DX, DX
bf8:
	CMPQ CX, $8
	JLT bf1
	VMOVUPS (AX)(DX*4), Y0
	VMOVUPS (BX)(DX*4), Y1
	VADDPS Y1, Y0, Y2
	VSUBPS Y1, Y0, Y3
	VMULPS Y7, Y3, Y3
	VMOVUPS Y2, (DI)(DX*4)
	VMOVUPS Y3, (SI)(DX*4)
	ADDQ $8, DX
	SUBQ $8, CX
	JMP bf8
bf1:
	TESTQ CX, CX
	JEQ bfdone
	VMOVSS (AX)(DX*4), X0
	VMOVSS (BX)(DX*4), X1
	VADDSS X1, X0, X2
	VSUBSS X1, X0, X3
	VMULSS X7, X3, X3
	VMOVSS X2, (DI)(DX*4)
	VMOVSS X3, (SI)(DX*4)
	INCQ DX
	DECQ CX
	JMP bf1
bfdone:
	VZEROUPPER
	RET

// func unbutterflyAVX2(x, y, u, v *float32, n int, gain float32)
// d = v * g; x = u + d; y = u - d
TEXT ·unbutterflyAVX2(SB), NOSPLIT, $0-44
	MOVQ x+0(FP), DI
	MOVQ y+8(FP), SI
	MOVQ u+16(FP), AX
	MOVQ v+24(FP), BX
	MOVQ n+32(FP), CX
	VBROADCASTSS gain+40(FP), Y7
	XORQ DX, DX
ub8:
	CMPQ CX, $8
	JLT ub1
	VMOVUPS (AX)(DX*4), Y0
	VMOVUPS (BX)(DX*4), Y1
	VMULPS Y7, Y1, Y1
	VADDPS Y1, Y0, Y2
	VSUBPS Y1, Y0, Y3
	VMOVUPS Y2, (DI)(DX*4)
	VMOVUPS Y3, (SI)(DX*4)
	ADDQ $8, DX
	SUBQ $8, CX
	JMP ub8
ub1:
	TESTQ CX, CX
	JEQ ubdone
	VMOVSS (AX)(DX*4), X0
	VMOVSS (BX)(DX*4), X1
	VMULSS X7, X1, X1
	VADDSS X1, X0, X2
	VSUBSS X1, X0, X3
	VMOVSS X2, (DI)(DX*4)
	VMOVSS X3, (SI)(DX*4)
	INCQ DX
	DECQ CX
	JMP ub1
ubdone:
	VZEROUPPER
	RET

// func addAVX2(dst, a, b *float32, n int)
TEXT ·addAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), AX
	MOVQ b+16(FP), BX
	MOVQ n+24(FP), CX
	XORQ DX, DX
ad8:
	CMPQ CX, $8
	JLT ad1
	VMOVUPS (AX)(DX*4), Y0
	VADDPS (BX)(DX*4), Y0, Y0
	VMOVUPS Y0, (DI)(DX*4)
	ADDQ $8, DX
	SUBQ $8, CX
	JMP ad8
ad1:
	TESTQ CX, CX
	JEQ addone
	VMOVSS (AX)(DX*4), X0
	VADDSS (BX)(DX*4), X0, X0
	VMOVSS X0, (DI)(DX*4)
	INCQ DX
	DECQ CX
	JMP ad1
addone:
	VZEROUPPER
	RET

// func axpyAVX2(dst *float32, c float32, x *float32, n int)
// dst += c * x
TEXT ·axpyAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	VBROADCASTSS c+8(FP), Y7
	MOVQ x+16(FP), AX
	MOVQ n+24(FP), CX
	XORQ DX, DX
ax8:
	CMPQ CX, $8
	JLT ax1
	VMULPS (AX)(DX*4), Y7, Y0
	VADDPS (DI)(DX*4), Y0, Y0
	VMOVUPS Y0, (DI)(DX*4)
	ADDQ $8, DX
	SUBQ $8, CX
	JMP ax8
ax1:
	TESTQ CX, CX
	JEQ axdone
	VMULSS (AX)(DX*4), X7, X0
	VADDSS (DI)(DX*4), X0, X0
	VMOVSS X0, (DI)(DX*4)
	INCQ DX
	DECQ CX
	JMP ax1
axdone:
	VZEROUPPER
	RET

// func momentumAVX2(m, c *float32, n int, beta, scale float32)
// m = beta * m + scale * c
TEXT ·momentumAVX2(SB), NOSPLIT, $0-32
	MOVQ m+0(FP), DI
	MOVQ c+8(FP), AX
	MOVQ n+16(FP), CX
	VBROADCASTSS beta+24(FP), Y6
	VBROADCASTSS scale+28(FP), Y7
	XORQ DX, DX
mo8:
	CMPQ CX, $8
	JLT mo1
	VMULPS (DI)(DX*4), Y6, Y0
	VMULPS (AX)(DX*4), Y7, Y1
	VADDPS Y1, Y0, Y0
	VMOVUPS Y0, (DI)(DX*4)
	ADDQ $8, DX
	SUBQ $8, CX
	JMP mo8
mo1:
	TESTQ CX, CX
	JEQ modone
	VMULSS (DI)(DX*4), X6, X0
	VMULSS (AX)(DX*4), X7, X1
	VADDSS X1, X0, X0
	VMOVSS X0, (DI)(DX*4)
	INCQ DX
	DECQ CX
	JMP mo1
modone:
	VZEROUPPER
	RET

// func meanSquareAVX2(v, c *float32, n int, beta, w float64, sums *[4]float64)
// per group of four, in float64: m = beta*v + (w*c)*c; v = float32(m);
// sums += m (lane by lane). n is a multiple of 4.
TEXT ·meanSquareAVX2(SB), NOSPLIT, $0-48
	MOVQ v+0(FP), DI
	MOVQ c+8(FP), AX
	MOVQ n+16(FP), CX
	VBROADCASTSD beta+24(FP), Y6
	VBROADCASTSD w+32(FP), Y7
	MOVQ sums+40(FP), BX
	VMOVUPD (BX), Y5
	XORQ DX, DX
ms4:
	CMPQ CX, $4
	JLT msdone
	VCVTPS2PD (DI)(DX*4), Y0
	VCVTPS2PD (AX)(DX*4), Y1
	VMULPD Y6, Y0, Y0
	VMULPD Y7, Y1, Y2
	VMULPD Y1, Y2, Y2
	VADDPD Y2, Y0, Y0
	VADDPD Y0, Y5, Y5
	VCVTPD2PSY Y0, X0
	VMOVUPS X0, (DI)(DX*4)
	ADDQ $4, DX
	SUBQ $4, CX
	JMP ms4
msdone:
	VMOVUPD Y5, (BX)
	VZEROUPPER
	RET

// func rmsDivideAVX2(c, v *float32, n int, unbias, floor float32)
// c = c / (sqrt(v*unbias) + floor)
TEXT ·rmsDivideAVX2(SB), NOSPLIT, $0-32
	MOVQ c+0(FP), DI
	MOVQ v+8(FP), AX
	MOVQ n+16(FP), CX
	VBROADCASTSS unbias+24(FP), Y6
	VBROADCASTSS floor+28(FP), Y7
	XORQ DX, DX
rd8:
	CMPQ CX, $8
	JLT rd1
	VMULPS (AX)(DX*4), Y6, Y0
	VSQRTPS Y0, Y0
	VADDPS Y7, Y0, Y0
	VMOVUPS (DI)(DX*4), Y1
	VDIVPS Y0, Y1, Y1
	VMOVUPS Y1, (DI)(DX*4)
	ADDQ $8, DX
	SUBQ $8, CX
	JMP rd8
rd1:
	TESTQ CX, CX
	JEQ rddone
	VMULSS (AX)(DX*4), X6, X0
	VSQRTSS X0, X0, X0
	VADDSS X7, X0, X0
	VMOVSS (DI)(DX*4), X1
	VDIVSS X0, X1, X1
	VMOVSS X1, (DI)(DX*4)
	INCQ DX
	DECQ CX
	JMP rd1
rddone:
	VZEROUPPER
	RET

// func nextAboveAVX2(v *float32, n int, from int, thr uint32) int
// The first i >= from with (bits(v[i]) & 0x7fffffff) > thr, or n.
TEXT ·nextAboveAVX2(SB), NOSPLIT, $0-40
	MOVQ v+0(FP), AX
	MOVQ n+8(FP), CX
	MOVQ from+16(FP), DX
	MOVL thr+24(FP), R10
	MOVQ R10, X7
	VPBROADCASTD X7, Y7
	VPCMPEQD Y6, Y6, Y6
	VPSRLD $1, Y6, Y6
na8:
	MOVQ CX, R8
	SUBQ DX, R8
	CMPQ R8, $8
	JLT na1
	VPAND (AX)(DX*4), Y6, Y0
	VPCMPGTD Y7, Y0, Y0
	VMOVMSKPS Y0, R9
	TESTL R9, R9
	JNE nafound
	ADDQ $8, DX
	JMP na8
nafound:
	BSFL R9, R9
	ADDQ R9, DX
	JMP nadone
na1:
	CMPQ DX, CX
	JGE nadone
	MOVL (AX)(DX*4), R9
	ANDL $0x7fffffff, R9
	CMPL R9, R10
	JHI nadone
	INCQ DX
	JMP na1
nadone:
	MOVQ DX, ret+32(FP)
	VZEROUPPER
	RET
