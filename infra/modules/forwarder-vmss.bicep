// The forwarder on one existing Linux scale set: identity attached and the installer added to
// the scale set model. Uniform scale sets with a Manual upgrade policy apply it to existing
// instances only after `az vmss update-instances` (docs/deploy.md).

@description('Name of the existing scale set (in the deployment\'s resource group).')
param vmssName string

@description('Resource id of the forwarders\' user-assigned identity.')
param forwarderIdentityResourceId string

@description('Attach the identity (merged with the scale set\'s current identities).')
param attachIdentity bool = true

@description('Shell command the Custom Script Extension runs (built by forwarder.bicep; nothing secret).')
param installCommand string

@description('Changing it reruns the extension.')
param forceUpdateTag string

@description('Port of the drain probe the installer configures (0: off). Refused when the scale set\'s automatic instance repairs watch a load balancer probe or the Application Health extension on this port.')
@minValue(0)
@maxValue(65535)
param drainProbePort int = 0

resource vmss 'Microsoft.Compute/virtualMachineScaleSets@2024-07-01' existing = {
  name: vmssName
}

// Issue 24: a drain probe must never be the probe the scale set's automatic instance repairs
// watch (drain-probe-guard.bicep). The guard deploys first and fails the deployment before
// anything below is written: the identity takes the scale set's name from it, the installer
// waits for it.
module drainProbeGuard 'drain-probe-guard.bicep' = {
  name: '${take('sebridge-drain-guard-${vmssName}', 50)}-${uniqueString(vmssName)}'
  params: {
    vmssName: vmssName
    drainProbePort: drainProbePort
    repairsPolicy: (vmss.properties.?automaticRepairsPolicy) ?? {}
    healthProbeId: (vmss.properties.?virtualMachineProfile.?networkProfile.?healthProbe.?id) ?? ''
    extensions: (vmss.properties.?virtualMachineProfile.?extensionProfile.?extensions) ?? []
  }
}

// Read here, written in a nested module (same reason as forwarder-vm.bicep).
var currentIdentity = vmss.?identity ?? {}
var keepsSystemAssigned = contains(string(currentIdentity.?type ?? 'None'), 'SystemAssigned')

module identity 'vmss-identity.bicep' = if (attachIdentity) {
  name: '${take('sebridge-vmss-identity-${vmssName}', 50)}-${uniqueString(vmssName)}'
  params: {
    vmssName: drainProbeGuard.outputs.vmssName
    location: vmss.location
    identityType: keepsSystemAssigned ? 'SystemAssigned, UserAssigned' : 'UserAssigned'
    userAssignedIdentities: union(currentIdentity.?userAssignedIdentities ?? {}, {
      '${forwarderIdentityResourceId}': {}
    })
  }
}

resource installer 'Microsoft.Compute/virtualMachineScaleSets/extensions@2024-07-01' = {
  parent: vmss
  name: 'sebridge-forwarder'
  properties: {
    publisher: 'Microsoft.Azure.Extensions'
    type: 'CustomScript'
    typeHandlerVersion: '2.1'
    autoUpgradeMinorVersion: true
    forceUpdateTag: forceUpdateTag
    protectedSettings: {
      commandToExecute: installCommand
    }
  }
  dependsOn: [
    identity
    drainProbeGuard
  ]
}
