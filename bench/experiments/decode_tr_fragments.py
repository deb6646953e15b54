#!/usr/bin/env python3
"""decode_tr_fragments.py -- the transposed decode walk's fragment
addressing (bench/experiments/decode-transposed-r8.patch, attention_notes
decode d41) checked on a model of ldmatrix (.trans), mma.sync m16n8k16 and
movmatrix.trans, one warp and one 32-key slab, against numpy products. The
same model then reproduces the plain walk's addressing, which the GPU
tests cover, so the model is the hardware's as far as the walk uses it.
Needs numpy; no GPU.

    python3 bench/experiments/decode_tr_fragments.py
"""
import numpy as np  # noqa: E402
rng=np.random.default_rng(0)
KW=32; D=64; RB=8
K=rng.standard_normal((KW,D)); V=rng.standard_normal((KW,D)); Q=rng.standard_normal((RB,D))
# smem as (row, chunk) -> 8 values
def ldsm4(mat, rows_of_lane, chunk_of_lane, trans=False):
    # mat: 2D array [rows][D]; returns regs[4][32] each a pair
    regs=[[None]*32 for _ in range(4)]
    for m in range(4):
        M=np.array([mat[rows_of_lane[m*8+i], chunk_of_lane[m*8+i]*8:chunk_of_lane[m*8+i]*8+8] for i in range(8)])
        if trans: M=M.T
        for t in range(32):
            regs[m][t]=(M[t//4,2*(t%4)], M[t//4,2*(t%4)+1])
    return regs
def mma(c,a,b0,b1):
    # c: [32][4], a: 4 regs [32] pairs, b: 2 regs
    A=np.zeros((16,16)); B=np.zeros((16,8))
    for t in range(32):
        g,t4=t//4,t%4
        A[g,2*t4:2*t4+2]=a[0][t]; A[g+8,2*t4:2*t4+2]=a[1][t]; A[g,2*t4+8:2*t4+10]=a[2][t]; A[g+8,2*t4+8:2*t4+10]=a[3][t]
        B[2*t4:2*t4+2,g]=b0[t]; B[2*t4+8:2*t4+10,g]=b1[t]
    C=A@B
    for t in range(32):
        g,t4=t//4,t%4
        c[t][0]+=C[g,2*t4]; c[t][1]+=C[g,2*t4+1]; c[t][2]+=C[g+8,2*t4]; c[t][3]+=C[g+8,2*t4+1]
def movt(x):
    X=np.zeros((8,8))
    for t in range(32): X[t//4,2*(t%4):2*(t%4)+2]=x[t]
    Y=X.T
    return [(Y[t//4,2*(t%4)],Y[t//4,2*(t%4)+1]) for t in range(32)]
lanes=range(32)
a_row=[(l&7)+((l>>3)&1)*8 for l in lanes]; a_ch=[l>>4 for l in lanes]
k_row=[(l&7)+(l>>4)*8 for l in lanes]; k_ch=[(l>>3)&1 for l in lanes]
WK=D//16; SN=KW//16
# Q^T frags
qf=[[None,None] for _ in range(WK)]
for kp in range(WK//2):
    r=ldsm4(Q,[l&7 for l in lanes],[4*kp+(l>>3) for l in lanes])
    qf[2*kp]=[r[0],r[1]]; qf[2*kp+1]=[r[2],r[3]]
s=[[[0.0]*4 for _ in range(32)] for _ in range(SN)]
for kk in range(WK):
    for mt in range(SN):
        kf=ldsm4(K,[mt*16+a_row[l] for l in lanes],[a_ch[l]+2*kk for l in lanes])
        mma(s[mt],kf,qf[kk][0],qf[kk][1])
ST=K@Q.T  # keys x rows
for mt in range(SN):
    for t in range(32):
        g,t4=t//4,t%4
        for e in range(2):
            for r in range(2):
                assert abs(s[mt][t][2*e+r]-ST[mt*16+g+8*e,2*t4+r])<1e-9
print("S^T ok")
# P = arbitrary (use exp of S^T)
P=np.exp(ST/8)
for mt in range(SN):
    for t in range(32):
        g,t4=t//4,t%4
        for e in range(2):
            for r in range(2): s[mt][t][2*e+r]=P[mt*16+g+8*e,2*t4+r]
o=[[[0.0]*4 for _ in range(32)] for _ in range(D//16)]
for mt in range(SN):
    pb0=movt([(s[mt][t][0],s[mt][t][1]) for t in lanes]); pb1=movt([(s[mt][t][2],s[mt][t][3]) for t in lanes])
    for i in range(D//16):
        vf=ldsm4(V,[mt*16+k_row[l] for l in lanes],[k_ch[l]+2*i for l in lanes],trans=True)
        mma(o[i],vf,pb0,pb1)
OT=V.T@P  # D x rows
for i in range(D//16):
    for t in range(32):
        g,t4=t//4,t%4
        for r in range(2):
            assert abs(o[i][t][r]-OT[16*i+g,2*t4+r])<1e-9
            assert abs(o[i][t][2+r]-OT[16*i+g+8,2*t4+r])<1e-9
print("O^T ok")
# the model against the plain walk's (working) addressing
Q16=rng.standard_normal((16,D))
sn=[[[0.0]*4 for _ in range(32)] for _ in range(KW//8)]
for kk in range(WK):
    qa=ldsm4(Q16,[a_row[l] for l in lanes],[a_ch[l]+2*kk for l in lanes])
    for np_ in range(KW//16):
        kf=ldsm4(K,[np_*16+k_row[l] for l in lanes],[k_ch[l]+2*kk for l in lanes])
        mma(sn[2*np_],qa,kf[0],kf[1]); mma(sn[2*np_+1],qa,kf[2],kf[3])
S=Q16@K.T
for n in range(KW//8):
    for t in range(32):
        g,t4=t//4,t%4
        assert abs(sn[n][t][0]-S[g,n*8+2*t4])<1e-9 and abs(sn[n][t][3]-S[g+8,n*8+2*t4+1])<1e-9
v_row=[(l&7)+((l>>3)&1)*8 for l in lanes]; v_ch=[l>>4 for l in lanes]
Pn=np.exp(S/8); on=[[[0.0]*4 for _ in range(32)] for _ in range(D//8)]
for kc in range(KW//16):
    pa=[[None]*32 for _ in range(4)]
    for t in range(32):
        g,t4=t//4,t%4
        pa[0][t]=(Pn[g,kc*16+2*t4],Pn[g,kc*16+2*t4+1]); pa[1][t]=(Pn[g+8,kc*16+2*t4],Pn[g+8,kc*16+2*t4+1])
        pa[2][t]=(Pn[g,kc*16+8+2*t4],Pn[g,kc*16+8+2*t4+1]); pa[3][t]=(Pn[g+8,kc*16+8+2*t4],Pn[g+8,kc*16+8+2*t4+1])
    for dp in range(D//16):
        vf=ldsm4(V,[kc*16+v_row[l] for l in lanes],[v_ch[l]+2*dp for l in lanes],trans=True)
        mma(on[2*dp],pa,vf[0],vf[1]); mma(on[2*dp+1],pa,vf[2],vf[3])
O=Pn@V
for i in range(D//8):
    for t in range(32):
        g,t4=t//4,t%4
        assert abs(on[i][t][0]-O[g,8*i+2*t4])<1e-9 and abs(on[i][t][3]-O[g+8,8*i+2*t4+1])<1e-9
print("plain walk's addressing reproduced by the model")
